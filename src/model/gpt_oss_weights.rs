//! gpt-oss's routed experts as the engine holds them. The checkpoint stacks them per layer:
//! `gate_up_proj` `[experts, hidden, 2 * inter]` (used as `x @ W`, gate and up columns
//! interleaved: gate even, up odd), `down_proj` `[experts, inter, hidden]`, and their biases
//! `gate_up_proj_bias` `[experts, 2 * inter]` (interleaved likewise) and `down_proj_bias`
//! `[experts, hidden]`. Hub checkpoints ship the two matrices as MXFP4 instead:
//! `*_blocks` `[experts, out, in / 32, 16]` and `*_scales` `[experts, out, in / 32]` (E8M0).
//!
//! One expert is read without the others: its gate `[inter, hidden]`, up and down
//! `[hidden, inter]` as every other family's. MXFP4 experts stay MXFP4: each HF block (byte
//! `j` holds elements `2j` (low nibble) and `2j + 1`) becomes a ggml `block_mxfp4` (the
//! scale byte, then byte `j` holding elements `j` and `j + 16`), the same codes and exponent
//! reordered, so the slots and the store keep them bit for bit (the gate's rows are the even
//! rows of `gate_up_proj`, the up's the odd ones). The biases are small and stay resident,
//! per layer one `[experts, 2 * inter + hidden]` tensor (per expert gate, up, down biases).

use super::config::ArchSpec;
use super::gguf::dequant;
use super::layer_weights::MlpWeights;
use super::names::{self, gpt_oss_experts as name};
use super::weights::{Checkpoint, GgmlBlob, HostTensor};
use crate::error::{Error, Result};
use crate::quant::GgmlType;

/// Values per MXFP4 block.
const BLOCK: usize = 32;

/// Whether layer `layer`'s experts are stored as MXFP4 (`quantization_config` mxfp4).
pub fn is_mxfp4(ck: &Checkpoint, layer: usize) -> bool {
    ck.contains(&name(layer, "gate_up_proj_blocks"))
}

/// Whether the checkpoint's routed experts are MXFP4 (its first MoE layer's are; gpt-oss
/// quantizes all or none), so they are kept as stored whatever format was asked for.
pub fn experts_are_mxfp4(ck: &Checkpoint, spec: &ArchSpec) -> bool {
    (0..spec.layers).find(|&i| spec.is_moe_layer(i)).is_some_and(|i| is_mxfp4(ck, i))
}

/// `(experts, hidden, inter)` of `spec`.
fn dims(spec: &ArchSpec) -> Result<(usize, usize, usize)> {
    let m = spec.moe.as_ref().ok_or_else(|| Error::InvalidArgument("dense model has no experts".into()))?;
    Ok((m.num_experts, spec.hidden, m.expert_intermediate))
}

/// Expert `e` of layer `layer` as gate `[inter, hidden]`, up `[inter, hidden]`, down
/// `[hidden, inter]` (MXFP4 experts with their ggml bytes).
pub fn expert(ck: &Checkpoint, spec: &ArchSpec, layer: usize, e: usize) -> Result<MlpWeights> {
    let (n, h, inter) = dims(spec)?;
    // A GGUF file's experts, registered per expert (`gguf::names`).
    let [g, u, d] = names::expert(spec.family, layer, e);
    if ck.contains(&g) {
        return Ok(MlpWeights {
            gate: ck.tensor(&g, &[inter, h])?,
            up: ck.tensor(&u, &[inter, h])?,
            down: ck.tensor(&d, &[h, inter])?,
        });
    }
    if let Some([gate, up, down]) = mxfp4_expert_bytes(ck, spec, layer, e)? {
        return Ok(MlpWeights {
            gate: mxfp4_tensor(gate, inter, h),
            up: mxfp4_tensor(up, inter, h),
            down: mxfp4_tensor(down, h, inter),
        });
    }
    let gu = ck.slab(&name(layer, "gate_up_proj"), &[n, h, 2 * inter], e)?.data;
    let dn = ck.slab(&name(layer, "down_proj"), &[n, inter, h], e)?.data;
    let column = |parity: usize| -> Vec<f32> {
        (0..inter).flat_map(|r| (0..h).map(move |c| (r, c))).map(|(r, c)| gu[c * 2 * inter + 2 * r + parity]).collect()
    };
    let down = (0..h).flat_map(|o| (0..inter).map(move |i| (o, i))).map(|(o, i)| dn[i * h + o]).collect();
    Ok(MlpWeights {
        gate: HostTensor::new(vec![inter, h], column(0)),
        up: HostTensor::new(vec![inter, h], column(1)),
        down: HostTensor::new(vec![h, inter], down),
    })
}

/// Expert `e`'s gate, up and down as ggml MXFP4 bytes (rows of blocks), without dequantizing
/// them (what a slot holds); `None` when layer `layer`'s experts are not MXFP4.
pub fn mxfp4_expert_bytes(ck: &Checkpoint, spec: &ArchSpec, layer: usize, e: usize) -> Result<Option<[Vec<u8>; 3]>> {
    if !is_mxfp4(ck, layer) {
        return Ok(None);
    }
    let (n, h, inter) = dims(spec)?;
    if !h.is_multiple_of(BLOCK) || !inter.is_multiple_of(BLOCK) {
        return Err(Error::UnsupportedConfig(format!(
            "MXFP4 experts need hidden_size {h} and intermediate_size {inter} to be multiples of {BLOCK}"
        )));
    }
    let matrix = |proj: &str, rows: usize, cols: usize| -> Result<(&[u8], &[u8])> {
        let g = cols / BLOCK;
        let blocks = ck.u8_slab(&name(layer, &format!("{proj}_blocks")), &[n, rows, g, 16], e)?;
        let scales = ck.u8_slab(&name(layer, &format!("{proj}_scales")), &[n, rows, g], e)?;
        Ok((blocks, scales))
    };
    let (gu_blocks, gu_scales) = matrix("gate_up_proj", 2 * inter, h)?;
    let (d_blocks, d_scales) = matrix("down_proj", h, inter)?;
    Ok(Some([
        mxfp4_rows(gu_blocks, gu_scales, h, (0..inter).map(|r| 2 * r)),
        mxfp4_rows(gu_blocks, gu_scales, h, (0..inter).map(|r| 2 * r + 1)),
        mxfp4_rows(d_blocks, d_scales, inter, 0..h),
    ]))
}

/// The `rows` (of `cols` columns each) of one expert's hub MXFP4 matrix as ggml MXFP4 bytes.
fn mxfp4_rows(blocks: &[u8], scales: &[u8], cols: usize, rows: impl Iterator<Item = usize>) -> Vec<u8> {
    let g = cols / BLOCK;
    let mut bytes = Vec::new();
    for r in rows {
        for b in 0..g {
            let hf = &blocks[(r * g + b) * 16..(r * g + b + 1) * 16];
            bytes.extend_from_slice(&ggml_block(hf, scales[r * g + b]));
        }
    }
    bytes
}

/// A `[rows, cols]` matrix of ggml MXFP4 `bytes` with its dequantization.
fn mxfp4_tensor(bytes: Vec<u8>, rows: usize, cols: usize) -> HostTensor {
    HostTensor {
        shape: vec![rows, cols],
        data: dequant::dequantize(GgmlType::Mxfp4, &bytes),
        int4: None,
        ggml: Some(GgmlBlob { ggml_type: GgmlType::Mxfp4, bytes }),
    }
}

/// One HF MXFP4 block (16 bytes, byte `j` = elements `2j` low, `2j + 1` high) and its scale as
/// ggml's `block_mxfp4` (scale, then byte `j` = elements `j` low, `j + 16` high).
pub fn ggml_block(hf: &[u8], scale: u8) -> [u8; 17] {
    let code = |i: usize| (hf[i / 2] >> (4 * (i % 2))) & 15;
    let mut out = [0u8; 17];
    out[0] = scale;
    for j in 0..16 {
        out[1 + j] = code(j) | (code(j + 16) << 4);
    }
    out
}

/// Layer `layer`'s expert biases `[experts, 2 * inter + hidden]`: per expert the gate's, the
/// up's (de-interleaved from `gate_up_proj_bias`) and the down's.
pub fn expert_bias(ck: &Checkpoint, spec: &ArchSpec, layer: usize) -> Result<HostTensor> {
    let (n, h, inter) = dims(spec)?;
    let dn = ck.tensor(&name(layer, "down_proj_bias"), &[n, h])?.data;
    // GGUF files hold the gate's and the up's apart (`gguf::names`).
    let (gate, up) = match ck.contains(&name(layer, "gate_proj_bias")) {
        true => (
            ck.tensor(&name(layer, "gate_proj_bias"), &[n, inter])?.data,
            ck.tensor(&name(layer, "up_proj_bias"), &[n, inter])?.data,
        ),
        false => {
            let gu = ck.tensor(&name(layer, "gate_up_proj_bias"), &[n, 2 * inter])?.data;
            (gu.iter().step_by(2).copied().collect(), gu.iter().skip(1).step_by(2).copied().collect())
        }
    };
    let mut data = Vec::with_capacity(n * (2 * inter + h));
    for e in 0..n {
        data.extend_from_slice(&gate[e * inter..(e + 1) * inter]);
        data.extend_from_slice(&up[e * inter..(e + 1) * inter]);
        data.extend_from_slice(&dn[e * h..(e + 1) * h]);
    }
    Ok(HostTensor::new(vec![n, 2 * inter + h], data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_reorder_keeps_every_value() {
        let hf: Vec<u8> = (0..16u8).map(|j| j.wrapping_mul(37).wrapping_add(11)).collect();
        let block = ggml_block(&hf, 125);
        let ours = dequant::dequantize(GgmlType::Mxfp4, &block);
        const FP4: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        for (i, v) in ours.iter().enumerate() {
            let code = (hf[i / 2] >> (4 * (i % 2))) & 15;
            assert_eq!(*v, FP4[code as usize] * 2f32.powi(125 - 127), "element {i}");
        }
    }
}
