//! An MoE layer's FFN input norm, router matmul and top-k as one dispatch (`norm_router`), for
//! CPU layouts, where every dispatch costs ~0.1 ms whatever its size: one 8-lane workgroup per
//! token normalises its row into `hn` (bit-identical to [`super::rms_norm::RmsNorm`]), computes
//! the router logits from it and chooses the experts as [`RouterTopK`](super::router::RouterTopK)
//! does.

use super::matmul::DecodeLayout;
use super::router::{choice_defines, choice_params, Capture, ChoiceFields, Forced, NormFields, RouterShape};
use super::GpuMatrix;
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// A bound fused norm + router + top-k.
pub struct NormRouter {
    kernel: Kernel,
}

/// What the fused router reads and writes.
#[derive(Clone, Copy)]
pub struct NormRouterIo<'a> {
    /// `[tokens, hidden]` residual stream (read).
    pub x: &'a wgpu::Buffer,
    /// `[hidden]` f32 norm weight.
    pub norm_weight: &'a wgpu::Buffer,
    /// `[tokens, hidden]` normalised rows (written): the experts' input.
    pub hn: &'a wgpu::Buffer,
    /// `[n_experts, hidden]` router matrix.
    pub router: &'a GpuMatrix,
    /// `[n_experts]` logit bias (gpt-oss), added before top-k.
    pub logit_bias: Option<&'a wgpu::Buffer>,
    /// `[tokens, top_k]` chosen expert ids (written).
    pub ids: &'a wgpu::Buffer,
    /// `[tokens, top_k]` their weights (written).
    pub weights: &'a wgpu::Buffer,
}

impl NormRouter {
    /// Binds `io`, or `None` where it does not apply: outside the CPU layout with one subgroup
    /// per workgroup (GPUs run the norm, a spread matmul and the top-k), or for a router
    /// matrix split into chunks.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: NormRouterIo<'_>,
        shape: RouterShape<'_>,
        eps: f32,
    ) -> Option<NormRouter> {
        Self::with(gpu, step, io, shape, eps, None, None)
    }

    /// [`new`](Self::new), optionally taking the experts from `forced` and keeping the
    /// prerouter's inputs (`capture`, whose FFN input is `io.hn`, the rows this kernel writes), as
    /// [`RouterTopK::with`](super::router::RouterTopK::with) does.
    pub fn with(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: NormRouterIo<'_>,
        shape: RouterShape<'_>,
        eps: f32,
        forced: Option<Forced<'_>>,
        capture: Option<Capture<'_>>,
    ) -> Option<NormRouter> {
        let [chunk] = &io.router.chunks[..] else { return None };
        if !DecodeLayout::for_gpu(gpu).one_subgroup_workgroups(gpu) || io.router.rows != shape.n_experts {
            return None;
        }
        let hidden = io.router.cols;
        let fields = ChoiceFields {
            forced_offset: forced.map_or(0, |f| f.offset),
            hidden,
            layer: capture.map_or(0, |c| c.layer),
            moe_layers: capture.map_or(0, |c| c.history.moe_layers),
        };
        let norm = NormFields { eps, w_scales: chunk.offsets.scales, w_mins: chunk.offsets.mins };
        let p = choice_params(&shape, fields, norm);
        let mut defines = vec!["ONE_SUBGROUP"];
        defines.extend(io.router.defines());
        defines.extend(choice_defines(&shape));
        let mut storage: Vec<Slice<'_>> = vec![
            io.x.into(),
            io.ids.into(),
            io.weights.into(),
            io.norm_weight.into(),
            (&chunk.buffer).into(),
            io.hn.into(),
        ];
        if let Some(b) = io.logit_bias {
            storage.push(b.into());
            defines.push("ROUTER_BIAS");
        }
        if let Some(f) = forced {
            storage.push(f.experts.into());
            defines.push("FORCED");
        }
        if let Some(c) = capture {
            storage.extend([Slice::from(&c.history.hidden), Slice::from(&c.history.ids)]);
            defines.push("CAPTURE");
        }
        // The router matrix and the norm weight once; per token its row in, its normalised row
        // out, its ids and weights.
        let traffic = Traffic {
            fixed: chunk.buffer.size() + 4 * hidden as u64,
            per_token: 4 * (2 * hidden + 2 * shape.top_k) as u64,
            per_position: 0,
        };
        Some(NormRouter { kernel: Kernel::new(gpu, "norm_router", &defines, step, &p, &storage).with_traffic(traffic) })
    }

    /// Records the norm, router and top-k of `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        self.kernel.dispatch(pass, n_tokens as u32, gpu.caps.max_workgroups_per_dim);
    }
}
