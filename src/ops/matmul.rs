//! `y = W x (+ bias)` for every token of a step: the decode matvec (`matvec`, several rows per
//! workgroup, for steps of up to [`MATVEC_MAX_TOKENS`] tokens) and the prefill matmul (`matmul`,
//! a tiled GEMM: 32 rows × 32 tokens per workgroup) for longer steps where
//! [`Caps::tiled_prefill`](crate::gpu::Caps::tiled_prefill) (GPUs; CPU adapters run every step
//! through the matvec).

use super::{params, BlobOffsets, GpuMatrix, WeightFormat};
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::quant::GgmlType;

/// Where and how a matmul writes its output.
#[derive(Clone, Copy, Debug)]
pub struct MatMulOut {
    /// Values per output row (the output buffer's width).
    pub stride: usize,
    /// First output column written (when several matrices share one output).
    pub col_offset: usize,
    /// Add to the output instead of overwriting it (fused residual add).
    pub accumulate: bool,
    /// Only the step's last token (its row of the output; the others are left as they are):
    /// the lm_head when only the next token's logits are needed. Runs the decode `matvec`
    /// whatever the step's length.
    pub last_token: bool,
}

impl MatMulOut {
    /// A plain output of `width` values per token.
    pub fn plain(width: usize) -> Self {
        MatMulOut { stride: width, col_offset: 0, accumulate: false, last_token: false }
    }
}

/// How the decode kernels (`matvec`, `expert_gate_up`, `expert_down`) lay rows over lanes, picked
/// from the adapter: one lane per row group on CPU adapters (lavapipe), where workgroups are
/// threads and lanes are SIMD lanes, and teams of lanes per row on GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeLayout {
    /// Each lane takes whole rows (`LANE_ROWS`): no cross-lane reduction.
    LaneRows,
    /// Teams of `team` lanes (8 or 32, [`crate::gpu::Caps::decode_team`]) per row, summed with
    /// subgroup shuffles (or shared memory when `shared_reduce`: no subgroups, or subgroups that
    /// may be smaller than a team).
    Teams {
        /// Lanes per team.
        team: u32,
        /// Sum teams through shared memory.
        shared_reduce: bool,
    },
}

pub use crate::gpu::kernel_choices::LayoutChoice;

/// Lanes of a decode kernel's workgroup in the `Teams` layout (`WG_SIZE` in shaders/team.wgsl).
const TEAMS_WORKGROUP: u32 = 64;

impl DecodeLayout {
    /// The layout for `gpu`, or the one `MOESTREAM_DECODE_LAYOUT` names
    /// ([`Caps::decode_layout`](crate::gpu::Caps::decode_layout), [`LayoutChoice`]).
    pub fn for_gpu(gpu: &Gpu) -> DecodeLayout {
        let teams = |team: u32| DecodeLayout::Teams {
            team,
            shared_reduce: !gpu.caps.subgroups || gpu.device.adapter_info().subgroup_min_size < team,
        };
        match gpu.caps.decode_layout {
            Some(LayoutChoice::Lanes) => DecodeLayout::LaneRows,
            Some(LayoutChoice::Teams) => teams(gpu.caps.decode_team),
            Some(LayoutChoice::Teams8) => teams(8),
            Some(LayoutChoice::Teams32) => teams(32),
            Some(LayoutChoice::TeamsShared) => DecodeLayout::Teams { team: gpu.caps.decode_team, shared_reduce: true },
            None if gpu.caps.cpu_layouts => DecodeLayout::LaneRows,
            None => teams(gpu.caps.decode_team),
        }
    }

    /// The shader defines selecting this layout.
    pub fn defines(self) -> &'static [&'static str] {
        match self {
            DecodeLayout::LaneRows => &["LANE_ROWS"],
            DecodeLayout::Teams { team: 32, shared_reduce: true } => &["TEAM32", "SHARED_REDUCE"],
            DecodeLayout::Teams { team: 32, shared_reduce: false } => &["TEAM32"],
            DecodeLayout::Teams { shared_reduce: true, .. } => &["SHARED_REDUCE"],
            DecodeLayout::Teams { shared_reduce: false, .. } => &[],
        }
    }

    /// The defines with which the decode kernels read `format` in 16-byte loads, if they can
    /// (`at`: each matrix's segments, [`BlobOffsets`] in the binding): f16 matrices starting on
    /// 16 bytes (`VEC4_WEIGHTS`: the weights bound as vec4s, shaders/weights_f16.wgsl; in the
    /// CPU layout also `LANE_WIDE`'s shared input, as below), or int4
    /// in groups of 32 whose rows (`cols` values) and matrices are 16-byte aligned
    /// (shaders/weights_int4.wgsl; a second, vec4 binding of the weights):
    /// * Teams layout: `WIDE`, a lane reads a whole group of 32 in one 16-byte load.
    /// * CPU layout: `WIDE` + `LANE_WIDE`, a lane takes two groups per step (two 16-byte code
    ///   loads, one word of scales, one of mins; rows of a multiple of 64) and the workgroup's 8
    ///   lanes, one subgroup, share the input's loads through `subgroupBroadcast`. On lavapipe each
    ///   storage load is a loop over the SIMD lanes, so the int4 matvec runs on fewer loads:
    ///   2.0-2.2 → 2.5-3.6 GB/s at 4096 × 4096 and 32000 × 512 (`bench kernels`, three runs each).
    ///
    /// Q4_K, Q5_K and padded Q6_K matrices starting on 16 bytes take the same two
    /// (shaders/weights_ggml_wide.wgsl): Q4_K a sub-block pair's 32 code bytes in two 16-byte
    /// loads (Q5_K its fifth bits in two more) and its block's head in four words, Q6_K a
    /// group's low and high bits in four 16-byte loads and its scales and d in two words.
    pub fn wide_defines(
        self,
        gpu: &Gpu,
        format: WeightFormat,
        cols: usize,
        at: &[BlobOffsets],
    ) -> &'static [&'static str] {
        let lane_wide = self.one_subgroup_workgroups(gpu) && cols.is_multiple_of(64);
        // The CPU layout's 16-byte loads as two 8-byte integers where the adapter has them
        // (Caps::words64, shaders/weights_common.wgsl).
        let lane_wide_int4: &'static [&'static str] =
            if gpu.caps.words64 { &["WIDE", "LANE_WIDE", "WORDS64"] } else { &["WIDE", "LANE_WIDE"] };
        // f16: the weights bound as vec4s, eight per load (shaders/weights_f16.wgsl).
        if format == WeightFormat::F16 {
            return match (at.iter().all(|o| o.data.is_multiple_of(8)), lane_wide) {
                (true, true) if gpu.caps.words64 => &["VEC4_WEIGHTS", "LANE_WIDE", "WORDS64"],
                (true, true) => &["VEC4_WEIGHTS", "LANE_WIDE"],
                (true, false) => &["VEC4_WEIGHTS"],
                (false, _) => &[],
            };
        }
        // Q4_K (144-byte blocks), Q5_K (176) and padded Q6_K (224): 16-byte aligned blocks
        // wherever the matrix is (offsets in bytes); padded Q8_0 (36) and MXFP4 (20): word-aligned
        // ones. Their readers are shader.rs's WIDE_GGML_DEFINES.
        let block_align = match format {
            WeightFormat::Ggml(GgmlType::Q4K | GgmlType::Q5K) | WeightFormat::Padded(GgmlType::Q6K) => Some(16),
            WeightFormat::Padded(GgmlType::Q8_0 | GgmlType::Mxfp4) => Some(4),
            _ => None,
        };
        if let Some(align) = block_align {
            return match (at.iter().all(|o| o.data.is_multiple_of(align)), self, lane_wide) {
                (false, ..) => &[],
                (true, DecodeLayout::Teams { .. }, _) => &["WIDE"],
                (true, DecodeLayout::LaneRows, true) => lane_wide_int4,
                (true, DecodeLayout::LaneRows, false) => &[],
            };
        }
        let int4_g32 = matches!(format, WeightFormat::Int4(p) if p.group_size == 32);
        let aligned = cols.is_multiple_of(32) && at.iter().all(|o| o.data.is_multiple_of(4));
        if !int4_g32 || !aligned {
            return &[];
        }
        match self {
            DecodeLayout::Teams { .. } => &["WIDE"],
            DecodeLayout::LaneRows => {
                let pairs = at.iter().all(|o| o.scales % 2 == 0 && o.mins % 2 == 0);
                match lane_wide && pairs {
                    true => lane_wide_int4,
                    false => &[],
                }
            }
        }
    }

    /// Whether this is the CPU layout and each of its 8-lane workgroups is one subgroup (subgroups
    /// of at least 8 lanes), so kernels may share values across a workgroup by subgroup operations.
    pub fn one_subgroup_workgroups(self, gpu: &Gpu) -> bool {
        self == DecodeLayout::LaneRows && gpu.caps.subgroups && gpu.device.adapter_info().subgroup_min_size >= 8
    }

    /// Rows a workgroup of a decode kernel computes, given the kernel's rows per team `R` as
    /// (`LaneRows` layout, `Teams` layout): 8 one-lane teams in the first, 64 lanes of teams in
    /// the second.
    pub fn rows_per_workgroup(self, r: (u32, u32)) -> u32 {
        match self {
            DecodeLayout::LaneRows => 8 * r.0,
            DecodeLayout::Teams { team, .. } => TEAMS_WORKGROUP / team * r.1,
        }
    }
}

/// Rows per team (`R`) of `matvec` in the (`LaneRows`, `Teams`) layouts, as in shaders/matvec.wgsl.
const MATVEC_R: (u32, u32) = (8, 2);

/// The most tokens a step runs through the decode `matvec` (one token after the other) where
/// the adapter has [`Caps::tiled_prefill`](crate::gpu::Caps::tiled_prefill); longer steps run the
/// tiled `matmul`, whose 32-token tiles would mostly idle on so few.
pub const MATVEC_MAX_TOKENS: usize = 3;

/// The most tokens a step may run through the CPU layout's `matvec` (which walks all of a step's
/// tokens in one invocation) over inputs up to `widest` wide on lavapipe, which stops an
/// invocation's loops after 65535 iterations in all. The f32 and other 4-byte-load rows take
/// about one iteration per 5.3 input values per token: measured wrong from tokens × width ≈
/// 350K (6144 × 64, 8192 × 48, 10944 × 32), right at 327K (8192 × 40); 300K keeps a margin
/// (int4 and f16 rows, loaded 16 bytes at a time, were right at 10944 × 64).
pub fn software_step_limit(widest: usize) -> usize {
    (300_000 / widest.max(1)).max(1)
}

/// Rows and tokens a workgroup of the prefill `matmul` computes (TN, TT in shaders/matmul.wgsl).
const MATMUL_TILE: (u32, u32) = (32, 32);

/// The second and third outputs of a [`MatMul::split`] and the rows of all three.
struct SplitOut<'a> {
    y1: &'a wgpu::Buffer,
    y2: &'a wgpu::Buffer,
    rows: [u32; 3],
}

/// A bound matmul: per weight chunk, the prefill kernel (none for a `last_token` output or
/// without [`Caps::tiled_prefill`](crate::gpu::Caps::tiled_prefill)), the decode kernel and the
/// chunk's rows.
pub struct MatMul {
    kernels: Vec<(Option<Kernel>, Kernel, u32)>,
    layout: DecodeLayout,
}

impl MatMul {
    /// Binds `x` (`[tokens, w.cols]`) → `y` through `w`, with an optional bias of `w.rows`.
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        x: &wgpu::Buffer,
        w: &GpuMatrix,
        bias: Option<&wgpu::Buffer>,
        y: &wgpu::Buffer,
        out: MatMulOut,
    ) -> MatMul {
        MatMul::build(gpu, step, x, w, bias, y, out, None)
    }

    /// One matmul for a matrix whose rows are three projections of the same input (q | k | v),
    /// each into its own output: `outputs` are the buffers and their widths (rows of `w`, in
    /// order, summing to `w.rows`). One dispatch per step instead of three.
    pub fn split(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        x: &wgpu::Buffer,
        w: &GpuMatrix,
        bias: Option<&wgpu::Buffer>,
        outputs: [(&wgpu::Buffer, usize); 3],
    ) -> MatMul {
        let [(y0, n0), (y1, n1), (y2, n2)] = outputs;
        assert_eq!(n0 + n1 + n2, w.rows, "split outputs cover the matrix's rows");
        let split = SplitOut { y1, y2, rows: [n0 as u32, n1 as u32, n2 as u32] };
        MatMul::build(gpu, step, x, w, bias, y0, MatMulOut::plain(n0), Some(split))
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        x: &wgpu::Buffer,
        w: &GpuMatrix,
        bias: Option<&wgpu::Buffer>,
        y: &wgpu::Buffer,
        out: MatMulOut,
        split: Option<SplitOut>,
    ) -> MatMul {
        let mut defines = Vec::new();
        defines.extend(w.defines());
        if bias.is_some() {
            defines.push("BIAS");
        }
        if split.is_some() {
            defines.push("SPLIT_OUT");
        }
        if out.accumulate {
            defines.push("ACCUMULATE");
        }
        let layout = DecodeLayout::for_gpu(gpu);
        let mut decode_defines = defines.clone();
        decode_defines.extend(layout.defines());
        if out.last_token {
            decode_defines.push("LAST_TOKEN");
        }
        let kernels = w
            .chunks
            .iter()
            .map(|c| {
                let mut words = vec![
                    w.cols as u32,
                    c.rows as u32,
                    (out.col_offset + c.first_row) as u32,
                    out.stride as u32,
                    c.first_row as u32,
                    c.offsets.scales,
                    c.offsets.mins,
                    0,
                ];
                let mut storage: Vec<Slice> = vec![x.into(), (&c.buffer).into(), y.into()];
                if let Some(s) = &split {
                    let [n0, n1, n2] = s.rows;
                    words.extend([n0, n0 + n1, n1, n2]);
                    storage.extend([Slice::from(s.y1), Slice::from(s.y2)]);
                }
                let p = params(&words);
                storage.extend(bias.map(Slice::from));
                let wide = layout.wide_defines(gpu, w.format, w.cols, &[c.offsets]);
                let mut decode_storage = storage.clone();
                let mut decode_defines = decode_defines.clone();
                // WIDE kernels bind the weights a second time, as vec4s.
                if wide.contains(&"WIDE") && w.format.wide_binds_vec4() {
                    decode_storage.push((&c.buffer).into());
                }
                decode_defines.extend(wide);
                // The chunk's weights once, then per token its input row and output rows.
                let row_bytes = 4 * (w.cols + c.rows) as u64;
                let traffic = match out.last_token {
                    true => Traffic { fixed: c.buffer.size() + row_bytes, per_token: 0, per_position: 0 },
                    false => Traffic { fixed: c.buffer.size(), per_token: row_bytes, per_position: 0 },
                };
                let prefill = (!out.last_token && gpu.caps.tiled_prefill)
                    .then(|| Kernel::new(gpu, "matmul", &defines, step, &p, &storage).with_traffic(traffic));
                (
                    prefill,
                    Kernel::new(gpu, "matvec", &decode_defines, step, &p, &decode_storage).with_traffic(traffic),
                    c.rows as u32,
                )
            })
            .collect();
        MatMul { kernels, layout }
    }

    /// Records the dispatches for `n_tokens` tokens (the decode kernel for up to
    /// [`MATVEC_MAX_TOKENS`], without a prefill kernel, or for the last token only with a
    /// `last_token` output).
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        let max = gpu.caps.max_workgroups_per_dim;
        for (matmul, matvec, rows) in &self.kernels {
            match matmul {
                Some(matmul) if n_tokens > MATVEC_MAX_TOKENS => {
                    let (tile_rows, tile_tokens) = MATMUL_TILE;
                    matmul.dispatch(pass, rows.div_ceil(tile_rows) * (n_tokens as u32).div_ceil(tile_tokens), max);
                }
                _ => matvec.dispatch(pass, rows.div_ceil(self.layout.rows_per_workgroup(MATVEC_R)), max),
            }
        }
    }
}
