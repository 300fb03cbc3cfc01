//! Host weights of a linear-attention layer (Gated DeltaNet: Qwen3-Next, Qwen3.5-MoE; KDA:
//! Ling), with the in-projection put into one layout, `[q | k | v | z | b | a]` by rows,
//! whichever way the checkpoint stores it.

use super::config::{ArchSpec, HybridSpec, LinearKind};
use super::weights::{Checkpoint, GgmlBlob, HostTensor};
use crate::error::Result;

/// One linear-attention layer's weights.
#[derive(Clone, Debug)]
pub struct LinearAttnWeights {
    /// `[in_width, hidden]`: rows of q (all key heads), k, v (all value heads), z (the output
    /// gate; KDA's `g_proj`), b (beta logits, one per value head), a (decay inputs, one per
    /// value head; KDA's `f_proj`, one per key channel).
    pub in_proj: HostTensor,
    /// Depthwise causal conv taps `[conv_dim, conv_kernel]` over the q|k|v channels.
    pub conv: HostTensor,
    /// `A_log` `[num_v_heads]`.
    pub a_log: HostTensor,
    /// `dt_bias` `[decay_inputs]` (per value head, or per key channel for KDA).
    pub dt_bias: HostTensor,
    /// The gated RMSNorm's weight `[head_v_dim]` (plain, not zero-centred).
    pub norm: HostTensor,
    /// `out_proj` `[hidden, value_dim]`.
    pub out: HostTensor,
}

/// A matrix made of row ranges `(tensor, first row, rows)` of same-width tensors, in order.
/// GGUF blocks are gathered too where every part keeps them in one ggml type (whole rows of
/// blocks move), so the matrix stays in that type on the GPU; a stored int4 form does not
/// survive (its scale groups may span the parts), nor do GGUF parts of different types.
fn gather_rows(parts: &[(&HostTensor, usize, usize)]) -> HostTensor {
    let cols = parts[0].0.shape[1];
    let mut data = Vec::with_capacity(parts.iter().map(|p| p.2).sum::<usize>() * cols);
    for &(t, first, rows) in parts {
        data.extend_from_slice(&t.data[first * cols..(first + rows) * cols]);
    }
    let ggml_type = parts[0].0.ggml.as_ref().map(|g| g.ggml_type);
    let same_type = parts.iter().all(|(t, _, _)| t.ggml.as_ref().map(|g| g.ggml_type) == ggml_type);
    let ggml = ggml_type.filter(|_| same_type).map(|ggml_type| {
        let mut bytes = Vec::new();
        for &(t, first, rows) in parts {
            let row_bytes = ggml_type.row_bytes(cols);
            let blob = &t.ggml.as_ref().expect("checked above").bytes;
            bytes.extend_from_slice(&blob[first * row_bytes..(first + rows) * row_bytes]);
        }
        GgmlBlob { ggml_type, bytes }
    });
    HostTensor { ggml, ..HostTensor::new(vec![data.len() / cols, cols], data) }
}

/// Qwen3-Next's `in_proj_qkvz` `[nk * (2 dk + 2 r dv), h]` and `in_proj_ba` `[nk * 2r, h]`
/// (`r = nv / nk`) hold, per key head, its q, k, its r value heads' v and z rows, and their b
/// and a rows: regroup them by kind.
fn ungroup(hy: &HybridSpec, qkvz: &HostTensor, ba: &HostTensor) -> HostTensor {
    let (nk, dk, dv) = (hy.num_k_heads, hy.head_k_dim, hy.head_v_dim);
    let r = hy.num_v_heads / nk;
    let group = 2 * dk + 2 * r * dv;
    let mut parts = Vec::new();
    // (offset within a key head's group, rows) of q, k, v, z.
    for (offset, rows) in [(0, dk), (dk, dk), (2 * dk, r * dv), (2 * dk + r * dv, r * dv)] {
        parts.extend((0..nk).map(|g| (qkvz, g * group + offset, rows)));
    }
    for offset in [0, r] {
        parts.extend((0..nk).map(|g| (ba, g * 2 * r + offset, r)));
    }
    gather_rows(&parts)
}

/// The module of layer `i`'s linear attention: `linear_attn` (Gated DeltaNet), or
/// `self_attn` (KDA, under the names transformers gives Ling's `attention`).
pub fn module(hy: &HybridSpec, i: usize) -> String {
    let m = if hy.kind.is_gated_delta_net() { "linear_attn" } else { "self_attn" };
    format!("{}.{m}", super::names::layer(i))
}

/// Reads KDA's weights under module `a`: q/k/v/g/b projections, `forget_gate.f_proj`, the
/// split `q/k/v_conv1d` taps, `o_norm` and `o_proj`.
fn kda(ck: &Checkpoint, spec: &ArchSpec, hy: &HybridSpec, a: &str) -> Result<LinearAttnWeights> {
    let h = spec.hidden;
    let t = |name: &str, shape: &[usize]| ck.tensor(&format!("{a}.{name}"), shape);
    let (kd, vd, nv, k) = (hy.key_dim(), hy.value_dim(), hy.num_v_heads, hy.conv_kernel);
    let [q, kp, v] =
        [("q_proj", kd), ("k_proj", kd), ("v_proj", vd)].map(|(n, rows)| t(&format!("{n}.weight"), &[rows, h]));
    let (q, kp, v) = (q?, kp?, v?);
    let g = t("g_proj.weight", &[vd, h])?;
    let b = t("b_proj.weight", &[nv, h])?;
    let f = t("forget_gate.f_proj.weight", &[kd, h])?;
    let in_proj = gather_rows(&[(&q, 0, kd), (&kp, 0, kd), (&v, 0, vd), (&g, 0, vd), (&b, 0, nv), (&f, 0, kd)]);
    let taps = [("q_conv1d", kd), ("k_conv1d", kd), ("v_conv1d", vd)]
        .map(|(n, c)| t(&format!("{n}.weight"), &[c, 1, k]).map(|w| w.data));
    let mut conv = Vec::with_capacity(hy.conv_dim() * k);
    for w in taps {
        conv.extend(w?);
    }
    Ok(LinearAttnWeights {
        in_proj,
        conv: HostTensor::new(vec![hy.conv_dim(), k], conv),
        a_log: t("forget_gate.A_log", &[nv])?,
        dt_bias: t("forget_gate.dt_bias", &[kd])?,
        norm: t("o_norm.weight", &[hy.head_v_dim])?,
        out: t("o_proj.weight", &[h, vd])?,
    })
}

/// Reads layer `i`'s linear-attention weights (under [`module`]).
pub fn linear_attention(ck: &Checkpoint, spec: &ArchSpec, hy: &HybridSpec, i: usize) -> Result<LinearAttnWeights> {
    let a = &module(hy, i);
    if let LinearKind::Kda { .. } = hy.kind {
        return kda(ck, spec, hy, a);
    }
    let h = spec.hidden;
    let t = |name: &str, shape: &[usize]| ck.tensor(&format!("{a}.{name}"), shape);
    let (kd, vd, nv) = (hy.key_dim(), hy.value_dim(), hy.num_v_heads);
    let in_proj = if hy.fused_projection {
        let qkvz = t("in_proj_qkvz.weight", &[2 * kd + 2 * vd, h])?;
        let ba = t("in_proj_ba.weight", &[2 * nv, h])?;
        ungroup(hy, &qkvz, &ba)
    } else {
        let qkv = t("in_proj_qkv.weight", &[hy.conv_dim(), h])?;
        let z = t("in_proj_z.weight", &[vd, h])?;
        let b = t("in_proj_b.weight", &[nv, h])?;
        let a = t("in_proj_a.weight", &[nv, h])?;
        gather_rows(&[(&qkv, 0, hy.conv_dim()), (&z, 0, vd), (&b, 0, nv), (&a, 0, nv)])
    };
    let conv = t("conv1d.weight", &[hy.conv_dim(), 1, hy.conv_kernel])?;
    Ok(LinearAttnWeights {
        in_proj,
        conv: HostTensor::new(vec![hy.conv_dim(), hy.conv_kernel], conv.data),
        a_log: t("A_log", &[nv])?,
        dt_bias: t("dt_bias", &[nv])?,
        norm: t("norm.weight", &[hy.head_v_dim])?,
        out: t("out_proj.weight", &[h, vd])?,
    })
}

/// Splits a gated attention's `q_proj` `[heads * 2 * head_dim, h]` (per head its query rows,
/// then its gate rows) into the query `[heads * head_dim, h]` and the gate (same shape).
pub fn split_query_gate(q: &HostTensor, heads: usize, head_dim: usize) -> (HostTensor, HostTensor) {
    let rows = |offset: usize| (0..heads).map(|i| (q, i * 2 * head_dim + offset, head_dim)).collect::<Vec<_>>();
    (gather_rows(&rows(0)), gather_rows(&rows(head_dim)))
}

/// Adds one to a zero-centred norm weight (`x * (1 + w)` becomes `x * w'`).
pub fn uncentre(mut w: HostTensor) -> HostTensor {
    w.int4 = None;
    w.ggml = None;
    w.data.iter_mut().for_each(|v| *v += 1.0);
    w
}
