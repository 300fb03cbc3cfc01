//! A projection and its LoRA deltas, applied unmerged: `y (+)= W x`, then `y += (s·B)(A x)` for
//! each adapter pair on that output. `W` keeps its format (f32, f16, int4); the small factors
//! are f32, with the scale `s` folded into `B` at upload.

use super::Builder;
use crate::error::Result;
use crate::gpu::{Gpu, Pass};
use crate::model::lora::{LoraAdapter, LoraPair, LoraTarget};
use crate::model::HostTensor;
use crate::ops::matmul::{MatMul, MatMulOut};
use crate::ops::{GpuMatrix, WeightFormat};

/// The adapter a decoder is built with, and the `[max_batch, padded rank]` buffer every
/// `A x` goes through (deltas run one after another, so one buffer serves all).
pub(super) struct LoraBinding<'a> {
    /// The adapter.
    pub adapter: &'a LoraAdapter,
    /// `A x` of the delta being recorded.
    pub tmp: wgpu::Buffer,
}

/// The rank rounded up to a multiple of 8, the column multiple the matmul kernels read.
pub(super) fn padded_rank(rank: usize) -> usize {
    rank.next_multiple_of(8)
}

/// `y += (s·B)(A x)`: `A x` into the binding's buffer, then `s·B` accumulated onto the output.
struct LoraDelta {
    a: MatMul,
    b: MatMul,
}

/// A matmul followed by the LoRA deltas on its output (none without an adapter).
pub(super) struct Projection {
    base: MatMul,
    deltas: Vec<LoraDelta>,
}

impl Projection {
    /// Records the matmul, then each delta, for `n` tokens.
    pub(super) fn record(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        self.base.record(gpu, pass, n);
        for d in &self.deltas {
            d.a.record(gpu, pass, n);
            d.b.record(gpu, pass, n);
        }
    }
}

/// Whether matrices would keep their stored form when stacked by [`HostTensor::concat_rows`]:
/// all int4 with the same parameters, all one GGUF type, or all plain values.
fn stored_alike(ts: &[&HostTensor]) -> bool {
    let int4 = ts.iter().map(|t| t.int4.as_ref().map(|m| m.params)).collect::<Vec<_>>();
    let ggml = ts.iter().map(|t| t.ggml.as_ref().map(|g| g.ggml_type)).collect::<Vec<_>>();
    int4.windows(2).all(|w| w[0] == w[1]) && ggml.windows(2).all(|w| w[0] == w[1])
}

/// `A` with zero rows and `s·B` with zero columns up to rank `width`: the same product, in the
/// shapes the kernels take.
fn gpu_factors(pair: &LoraPair, scale: f32, width: usize) -> (HostTensor, HostTensor) {
    let (r, inp, out) = (pair.a.shape[0], pair.a.shape[1], pair.b.shape[0]);
    let mut a = pair.a.data.clone();
    a.resize(width * inp, 0.0);
    let b = pair
        .b
        .data
        .chunks_exact(r)
        .flat_map(|row| row.iter().map(|v| v * scale).chain(std::iter::repeat_n(0.0, width - r)))
        .collect();
    (HostTensor::new(vec![width, inp], a), HostTensor::new(vec![out, width], b))
}

impl Builder<'_> {
    /// [`Builder::matmul`] plus the adapter's delta for `target` of layer `layer`, if any.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn projection(
        &mut self,
        label: &str,
        w: &HostTensor,
        bias: Option<&HostTensor>,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        out: MatMulOut,
        (layer, target): (usize, LoraTarget),
    ) -> Result<Projection> {
        let base = self.matmul(label, w, bias, x, y, out)?;
        self.with_lora(base, layer, &[(target, out, y)], x)
    }

    /// The query, key and value projections of layer `layer` from `x` into `outputs`: one
    /// matmul of the three matrices stacked (one dispatch a step instead of three, the same
    /// values row for row) where they are stored alike (all int4 with the same parameters, all
    /// one GGUF type, or all plain), else three.
    pub(super) fn qkv(
        &mut self,
        layer: usize,
        weights: [&HostTensor; 3],
        bias: Option<&[HostTensor; 3]>,
        x: &wgpu::Buffer,
        outputs: [(&wgpu::Buffer, usize); 3],
    ) -> Result<Vec<Projection>> {
        const TARGETS: [(&str, LoraTarget); 3] = [("q", LoraTarget::Q), ("k", LoraTarget::K), ("v", LoraTarget::V)];
        let separate = |bld: &mut Self| {
            (0..3)
                .map(|j| {
                    let ((label, target), (y, n)) = (TARGETS[j], outputs[j]);
                    bld.projection(label, weights[j], bias.map(|b| &b[j]), x, y, MatMulOut::plain(n), (layer, target))
                })
                .collect()
        };
        if !stored_alike(&weights) {
            return separate(self);
        }
        let stack = |t: [&HostTensor; 3]| HostTensor::concat_rows(&t);
        // A matrix the upload refuses (a non-finite weight...) is uploaded part by part, so the
        // error names the checkpoint's tensor and its row.
        let Ok(m) = self.matrix("qkv", &stack(weights)) else {
            return separate(self);
        };
        let bias = bias.map(|[bq, bk, bv]| {
            let data = [&bq.data[..], &bk.data, &bv.data].concat();
            self.gpu.upload("qkv bias", bytemuck::cast_slice(&data))
        });
        let base = MatMul::split(self.gpu, self.step, x, &self.matrices[m], bias.as_ref(), outputs);
        self.buffers.extend(bias);
        let targets = [0, 1, 2].map(|j| (TARGETS[j].1, MatMulOut::plain(outputs[j].1), outputs[j].0));
        Ok(vec![self.with_lora(base, layer, &targets, x)?])
    }

    /// `base` (reading `x`) followed by the deltas of layer `layer`'s `targets` the adapter
    /// has, each accumulated onto its output where its [`MatMulOut`] places it (a fused
    /// matrix's targets own different columns or outputs).
    pub(super) fn with_lora(
        &mut self,
        base: MatMul,
        layer: usize,
        targets: &[(LoraTarget, MatMulOut, &wgpu::Buffer)],
        x: &wgpu::Buffer,
    ) -> Result<Projection> {
        let mut deltas = Vec::new();
        let Some(LoraBinding { adapter, tmp }) = &self.lora else {
            return Ok(Projection { base, deltas });
        };
        let (adapter, tmp) = (*adapter, tmp.clone());
        let width = padded_rank(adapter.rank());
        for &(target, out, y) in targets {
            let Some(pair) = adapter.pair(layer, target) else { continue };
            let (a, b) = gpu_factors(pair, adapter.scale(), width);
            let a = GpuMatrix::upload(self.gpu, "lora A", &a, WeightFormat::F32)?;
            let b = GpuMatrix::upload(self.gpu, "lora B", &b, WeightFormat::F32)?;
            deltas.push(LoraDelta {
                a: MatMul::new(self.gpu, self.step, x, &a, None, &tmp, MatMulOut::plain(width)),
                b: MatMul::new(self.gpu, self.step, &tmp, &b, None, y, MatMulOut { accumulate: true, ..out }),
            });
            self.matrices.extend([a, b]);
        }
        Ok(Projection { base, deltas })
    }
}
