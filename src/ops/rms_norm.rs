//! RMSNorm over rows (whole hidden states, single heads, or whole projections).

use super::one_subgroup_layout;
use super::params;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// Which rows a norm touches.
#[derive(Clone, Copy, Debug)]
pub struct NormRows {
    /// Values per row.
    pub n: usize,
    /// Rows per token (heads for a per-head q/k norm, else 1).
    pub rows_per_token: usize,
    /// Rows start at the step's position (normalising keys already in the KV cache).
    pub at_cache_pos: bool,
}

/// A bound RMSNorm.
pub struct RmsNorm {
    kernel: Kernel,
    rows_per_token: usize,
}

impl RmsNorm {
    /// Normalises `x` in place, or into `out` when given, with `weight` (`n` f32 values).
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        x: &wgpu::Buffer,
        out: Option<&wgpu::Buffer>,
        rows: NormRows,
        eps: f32,
    ) -> RmsNorm {
        let p =
            params(&[rows.n as u32, rows.rows_per_token as u32, eps.to_bits(), rows.at_cache_pos as u32, 0, 0, 0, 0]);
        let lanes = row_lanes(gpu, rows.n);
        let kernel = match out {
            Some(o) => {
                let defines = [&["OUT"][..], lanes].concat();
                Kernel::new(gpu, "rms_norm", &defines, step, &p, &[weight.into(), x.into(), o.into()])
            }
            None => Kernel::new(gpu, "rms_norm", lanes, step, &p, &[weight.into(), x.into()]),
        };
        // Per token its rows in and out; the weight once.
        let per_token = 8 * (rows.n * rows.rows_per_token) as u64;
        let kernel = kernel.with_traffic(Traffic { fixed: 4 * rows.n as u64, per_token, per_position: 0 });
        RmsNorm { kernel, rows_per_token: rows.rows_per_token }
    }

    /// Adds the `top_k` rows of `y` per token into `x` (an MoE layer's combine without a gated
    /// shared expert, as [`super::moe_combine::MoeCombine`] adds them), then normalises each
    /// row of `x` (`n` values) into `out`: the combine fused into the next norm.
    #[allow(clippy::too_many_arguments)]
    pub fn after_combine(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        x: &wgpu::Buffer,
        out: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n: usize,
        top_k: usize,
        eps: f32,
    ) -> RmsNorm {
        let p = params(&[n as u32, 1, eps.to_bits(), 0, top_k as u32, 0, 0, 0]);
        let storage = [weight.into(), x.into(), out.into(), y.into()];
        let defines = [&["OUT", "ADD_PAIRS"][..], row_lanes(gpu, n)].concat();
        let kernel = Kernel::new(gpu, "rms_norm", &defines, step, &p, &storage);
        // Per token its top-k expert rows, its row in, back and out; the weight once.
        let per_token = 4 * ((top_k + 3) * n) as u64;
        let kernel = kernel.with_traffic(Traffic { fixed: 4 * n as u64, per_token, per_position: 0 });
        RmsNorm { kernel, rows_per_token: 1 }
    }

    /// Normalises two tensors' rows in place in one dispatch, each row as [`new`](Self::new)
    /// would (`first` then `second`: weight, rows, their layout): a layer's q and k norms.
    pub fn pair(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        first: (&wgpu::Buffer, &wgpu::Buffer, NormRows),
        second: (&wgpu::Buffer, &wgpu::Buffer, NormRows),
        eps: f32,
    ) -> RmsNorm {
        let ((w1, x1, r1), (w2, x2, r2)) = (first, second);
        assert!(!r1.at_cache_pos && !r2.at_cache_pos, "paired norms touch the step's rows");
        let p = params(&[
            r1.n as u32,
            r1.rows_per_token as u32,
            eps.to_bits(),
            0,
            0,
            r2.n as u32,
            r2.rows_per_token as u32,
            0,
        ]);
        let defines = [&["PAIR"][..], row_lanes(gpu, r1.n.max(r2.n))].concat();
        let kernel = Kernel::new(gpu, "rms_norm", &defines, step, &p, &[w1.into(), x1.into(), w2.into(), x2.into()]);
        // Per token both tensors' rows in and out; the weights once.
        let per_token = 8 * (r1.n * r1.rows_per_token + r2.n * r2.rows_per_token) as u64;
        let kernel = kernel.with_traffic(Traffic { fixed: 4 * (r1.n + r2.n) as u64, per_token, per_position: 0 });
        RmsNorm { kernel, rows_per_token: r1.rows_per_token + r2.rows_per_token }
    }

    /// Records the norm for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        self.kernel.dispatch(pass, (n_tokens * self.rows_per_token) as u32, gpu.caps.max_workgroups_per_dim);
    }
}

/// Rows of at least this many values take 256 lanes on GPUs (`WIDE_ROW`).
const WIDE_ROW_MIN: usize = 1024;

/// How many lanes normalise a row of `n`: `ONE_SUBGROUP` (a row per 8-lane workgroup summed with
/// `subgroupAdd`, no workgroup memory) where the decode kernels take the CPU layout and every
/// subgroup holds an 8-lane workgroup, as lavapipe charges a kernel that uses workgroup memory
/// several times its work per dispatch; `WIDE_ROW` (256 lanes) for long rows on GPUs, where a
/// row's 64 lanes would each wait on a chain of `n / 64` loads; else 64.
fn row_lanes(gpu: &Gpu, n: usize) -> &'static [&'static str] {
    if one_subgroup_layout(gpu).is_some() {
        &["ONE_SUBGROUP"]
    } else if !gpu.caps.cpu_layouts && n >= WIDE_ROW_MIN {
        &["WIDE_ROW"]
    } else {
        &[]
    }
}
