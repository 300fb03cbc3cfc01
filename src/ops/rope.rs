//! Rotary position embedding with host-computed cos/sin tables ([`RopeSpec::tables`]).

use super::{groups64, params};
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::model::RopeSpec;

/// Where the rotated values sit in each token's row.
#[derive(Clone, Copy, Debug)]
pub struct RopeLayout {
    /// Heads per row.
    pub n_heads: usize,
    /// Values between consecutive heads.
    pub head_stride: usize,
    /// Values per token row.
    pub row_stride: usize,
    /// First rotated value within a head.
    pub offset: usize,
    /// Rows start at the step's position (keys written into a cache).
    pub at_cache_pos: bool,
}

impl RopeLayout {
    /// The kernels' `Layout` words (shaders/rope_pairs.wgsl).
    pub(crate) fn words(&self) -> [u32; 8] {
        let l = [self.n_heads, self.head_stride, self.row_stride, self.offset, self.at_cache_pos as usize];
        [l[0] as u32, l[1] as u32, l[2] as u32, l[3] as u32, l[4] as u32, 0, 0, 0]
    }

    /// Bytes a token's rotation moves: its rotated values in and out and one cos/sin row.
    pub(crate) fn bytes_per_token(&self, rotary_dim: usize) -> u64 {
        4 * (2 * self.n_heads * rotary_dim + rotary_dim) as u64
    }

    /// `n_heads` contiguous heads of `head_dim`, rotated from their first value.
    pub fn heads(n_heads: usize, head_dim: usize, at_cache_pos: bool) -> RopeLayout {
        RopeLayout { n_heads, head_stride: head_dim, row_stride: n_heads * head_dim, offset: 0, at_cache_pos }
    }
}

/// A bound in-place RoPE.
pub struct Rope {
    kernel: Kernel,
    pairs_per_token: usize,
}

impl Rope {
    /// Rotates `x` laid out as `layout` says, by `rope`'s rotary width and pair layout, with
    /// `tables` from [`RopeSpec::tables`].
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        tables: (&wgpu::Buffer, &wgpu::Buffer),
        x: &wgpu::Buffer,
        rope: &RopeSpec,
        layout: RopeLayout,
    ) -> Rope {
        let mut words = vec![rope.rotary_dim as u32, rope.interleaved as u32, 0, 0];
        words.extend(layout.words());
        let per_token = layout.bytes_per_token(rope.rotary_dim);
        let storage = [tables.0.into(), tables.1.into(), x.into()];
        let kernel = Kernel::new(gpu, "rope", &[], step, &params(&words), &storage).with_traffic(Traffic {
            fixed: 0,
            per_token,
            per_position: 0,
        });
        Rope { kernel, pairs_per_token: layout.n_heads * rope.rotary_dim / 2 }
    }

    /// Records the rotation for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        self.kernel.dispatch(pass, groups64(n_tokens * self.pairs_per_token), gpu.caps.max_workgroups_per_dim);
    }
}
