//! Gated DeltaNet's short causal depthwise convolution (with SiLU) over a sequence's window.

use super::{groups64, params};
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// The conv's sizes: `channels` convolved independently with `kernel` taps each, inputs read
/// `in_stride` values apart per token.
#[derive(Clone, Copy, Debug)]
pub struct ConvShape {
    /// Channels (q, k and v of every head).
    pub channels: usize,
    /// Taps per channel (at most [`crate::model::config::MAX_CONV_KERNEL`]).
    pub kernel: usize,
    /// Values per token of the input buffer (the channels are its first `channels`).
    pub in_stride: usize,
}

/// A bound causal conv step.
pub struct CausalConv1d {
    kernel: Kernel,
    channels: usize,
}

impl CausalConv1d {
    /// Binds input `x` (`[tokens, in_stride]`), taps `w` (`[channels, kernel]`), the
    /// sequence's `window` (`[channels, kernel - 1]`, updated) and `out` (`[tokens, channels]`).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        buffers: (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        shape: ConvShape,
    ) -> CausalConv1d {
        Self::build(gpu, step, buffers, shape, None)
    }

    /// [`CausalConv1d::new`] that also writes the window after each token of the step into
    /// `snaps` (`[tokens, channels, kernel - 1]`), for a step of draft tokens to be cut back.
    pub fn with_snapshots(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        buffers: (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        shape: ConvShape,
        snaps: &wgpu::Buffer,
    ) -> CausalConv1d {
        Self::build(gpu, step, buffers, shape, Some(snaps))
    }

    fn build(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        (x, w, window, out): (&wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer, &wgpu::Buffer),
        shape: ConvShape,
        snaps: Option<&wgpu::Buffer>,
    ) -> CausalConv1d {
        let p = params(&[shape.channels as u32, shape.kernel as u32, shape.in_stride as u32, 0]);
        let c = shape.channels as u64;
        // The taps and the window in and out once; per token one input and one output.
        let traffic = Traffic { fixed: 4 * c * (3 * shape.kernel as u64 - 2), per_token: 8 * c, per_position: 0 };
        let mut buffers: Vec<Slice> = vec![x.into(), w.into(), window.into(), out.into()];
        buffers.extend(snaps.map(Slice::from));
        let defines: &[&str] = if snaps.is_some() { &["SNAPSHOTS"] } else { &[] };
        let kernel = Kernel::new(gpu, "causal_conv1d", defines, step, &p, &buffers).with_traffic(traffic);
        CausalConv1d { kernel, channels: shape.channels }
    }

    /// Records the conv over the step's `n_tokens` tokens (in order, one invocation per channel).
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass) {
        self.kernel.dispatch(pass, groups64(self.channels), gpu.caps.max_workgroups_per_dim);
    }
}
