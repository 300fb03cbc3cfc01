//! The routed-expert FFN of one MoE layer over the slot arena: gate/up + SwiGLU, then down
//! scaled by the routing weight. One dispatch pair per arena chunk. Steps of up to
//! [`MATVEC_MAX_TOKENS`] tokens (decode) run `expert_gate_up` / `expert_down`, one workgroup per
//! (token expert pair, block of rows) laid out as the decode matvec ([`DecodeLayout`]). Longer
//! steps (prefill) run the same on CPU adapters, and on GPUs `expert_matmul`, one workgroup per
//! (expert, block of rows, tile of the pairs routed to it): each expert's weights are read
//! once per tile of its tokens ([`ExpertPrefill`]).

use super::matmul::{DecodeLayout, MATVEC_MAX_TOKENS};
use super::params;
use super::slot_layout::SlotLayout;
use super::{BlobOffsets, WeightFormat};
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::model::ExpertAct;

/// The expert slots as the kernels bind them: the arena's buffers and the (layer, expert) →
/// slot table (`experts::SlotArena` and `experts::SlotTable` own them).
#[derive(Clone, Copy)]
pub struct SlotBinding<'a> {
    /// The arena's buffers; slot `s` lives in `chunks[s / slots_per_chunk]`.
    pub chunks: &'a [wgpu::Buffer],
    /// Slots per buffer.
    pub slots_per_chunk: usize,
    /// Total slots.
    pub slots: usize,
    /// Bytes per slot.
    pub slot_bytes: usize,
    /// The slot table's buffer, `[layers * experts]` u32.
    pub table: &'a wgpu::Buffer,
    /// Experts per layer (a row of the table).
    pub experts: usize,
}

/// Buffers an expert FFN reads and writes.
pub struct ExpertIo<'a> {
    /// Normed hidden states `[tokens, hidden]`.
    pub x: &'a wgpu::Buffer,
    /// Routed expert ids `[tokens * top_k]`.
    pub ids: &'a wgpu::Buffer,
    /// Routing weights `[tokens * top_k]`.
    pub route_w: &'a wgpu::Buffer,
    /// Scratch `[tokens * top_k, inter]`.
    pub h: &'a wgpu::Buffer,
    /// Per-pair outputs `[tokens * top_k, hidden]`.
    pub y: &'a wgpu::Buffer,
    /// The experts' activation; for [`ExpertAct::ClampedSwiGlu`] also the layer's expert
    /// biases `[experts, 2 * inter + hidden]` (per expert gate, up, down).
    pub act: (ExpertAct, Option<&'a wgpu::Buffer>),
}

/// Rows per team (`R`) of `expert_gate_up` in the (`LaneRows`, `Teams`) layouts, as in its shader.
const GATE_UP_R: (u32, u32) = (4, 4);

/// Rows per team (`R`) of `expert_down` in the (`LaneRows`, `Teams`) layouts, as in its shader
/// (4 in the CPU layout: 8 with `LANE_WIDE` loads was 6× slower on lavapipe; f16 alike either way).
const DOWN_R: (u32, u32) = (4, 2);

/// Rows and pairs per workgroup of `expert_matmul` (TN, TT in its shader).
const EXPERT_TILE: (usize, usize) = (32, 32);

pub use crate::gpu::kernel_choices::ExpertPrefill;

impl ExpertPrefill {
    /// `Pairs` for clamped experts with biases (gpt-oss: `expert_matmul` has no such variant);
    /// else `Gather` on GPUs and `Pairs` on CPU adapters, in every format (the decode kernels
    /// read ggml blocks in whole words or 16-byte loads, no longer value by value); or what
    /// `MOESTREAM_EXPERT_PREFILL` names (`pairs`, `gather`; for comparing the two on one adapter).
    pub fn for_layer(gpu: &Gpu, act: ExpertAct) -> ExpertPrefill {
        if act.has_bias() {
            return ExpertPrefill::Pairs;
        }
        match gpu.caps.expert_prefill {
            Some(forced) => forced,
            None if gpu.caps.cpu_layouts => ExpertPrefill::Pairs,
            None => ExpertPrefill::Gather,
        }
    }
}

/// A bound expert FFN for one layer: per arena chunk, the decode kernels and, with
/// [`ExpertPrefill::Gather`], the prefill ones (gate/up, down).
pub struct ExpertFfn {
    gate_up: Vec<Kernel>,
    down: Vec<Kernel>,
    gather: Vec<(Kernel, Kernel)>,
    top_k: usize,
    n_experts: usize,
    hidden: usize,
    inter: usize,
    layout: DecodeLayout,
}

impl ExpertFfn {
    /// Binds layer `layer`'s experts (found through the slot table) in the slots, laid out
    /// within each slot as `layout` says (the layer's own formats; the arena's slots may be
    /// larger), running prefill steps as `prefill` says.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: ExpertIo<'_>,
        slots: SlotBinding<'_>,
        layout: &SlotLayout,
        layer: usize,
        top_k: usize,
        prefill: ExpertPrefill,
    ) -> ExpertFfn {
        debug_assert!(layout.slot_bytes <= slots.slot_bytes, "a layer's experts fit the arena's slots");
        let decode = DecodeLayout::for_gpu(gpu);
        let with_decode = |proj: usize| {
            let mut d = layout.reader_defines(proj);
            d.extend(decode.defines());
            d
        };
        let (mut gate_up_defines, mut down_defines) = (with_decode(0), with_decode(2));
        let (alpha, limit, bias) = match io.act {
            (ExpertAct::ClampedSwiGlu { alpha, limit }, Some(bias)) => {
                gate_up_defines.push("CLAMPED");
                down_defines.push("CLAMPED");
                (alpha, limit, Some(bias))
            }
            (ExpertAct::ClampedSwiGlu { .. }, None) => panic!("clamped SwiGLU experts need their biases"),
            (ExpertAct::SwiGlu, _) => (0.0, 0.0, None),
        };
        assert!(bias.is_none() || prefill == ExpertPrefill::Pairs, "clamped experts prefill pair by pair (for_layer)");
        let mut gate_up_mm_defines = layout.reader_defines(0);
        gate_up_mm_defines.push("GATE_UP");
        let down_mm_defines = layout.reader_defines(2);
        let (hidden, inter) = (layout.hidden, layout.inter);
        let [gate_at, up_at, down_at] =
            [0, 1, 2].map(|i| layout.proj_offsets(i).expect("slot layout was validated when the arena was made"));
        let proj: Vec<u32> = [gate_at, up_at, down_at].iter().flat_map(|o| [o.data, o.scales, o.mins, 0]).collect();
        // Every slot starts where the first one does, shifted by whole slots.
        let slot_start = |f| BlobOffsets::default().shifted(f, slots.slot_bytes);
        let gate_up_at = [gate_at, up_at, slot_start(layout.format)];
        gate_up_defines.extend(decode.wide_defines(gpu, layout.format, hidden, &gate_up_at));
        let down_at = [down_at, slot_start(layout.down_format)];
        down_defines.extend(decode.wide_defines(gpu, layout.down_format, inter, &down_at));
        let (mut gate_up, mut down, mut gather) = (Vec::new(), Vec::new(), Vec::new());
        for (c, chunk) in slots.chunks.iter().enumerate() {
            let first = c * slots.slots_per_chunk;
            let mut words = vec![
                hidden as u32,
                inter as u32,
                top_k as u32,
                (layer * slots.experts) as u32,
                first as u32,
                slots.slots_per_chunk.min(slots.slots - first) as u32,
                (slots.slot_bytes / 4) as u32,
                slots.experts as u32,
            ];
            words.extend(&proj);
            words.extend([alpha.to_bits(), limit.to_bits(), 0, 0]);
            let p = params(&words);
            // Per token: its top-k experts' projections (distinct experts when decoding; an upper
            // bound in prefill, where tokens share experts), and the activations in and out.
            let (gate_up_bytes, down_bytes) =
                (layout.proj_bytes[2] as u64, (layout.slot_bytes - layout.proj_bytes[2]) as u64);
            let (h, i, k) = (hidden as u64, inter as u64, top_k as u64);
            let gate_up_traffic = Traffic { fixed: 0, per_token: k * (gate_up_bytes + 4 * (h + i)), per_position: 0 };
            let down_traffic = Traffic { fixed: 0, per_token: k * (down_bytes + 4 * (h + i)), per_position: 0 };
            let gate_up_io: Vec<_> = [io.x.into(), io.ids.into(), slots.table.into(), chunk.into(), io.h.into()]
                .into_iter()
                .chain(bias.map(|b| b.into()))
                .collect();
            let down_io: Vec<_> =
                [io.h.into(), io.ids.into(), io.route_w.into(), slots.table.into(), chunk.into(), io.y.into()]
                    .into_iter()
                    .chain(bias.map(|b| b.into()))
                    .collect();
            let bind = |name, defines: &[&str], storage: &[_], traffic| {
                Kernel::new(gpu, name, defines, step, &p, storage).with_traffic(traffic)
            };
            // WIDE kernels bind the chunk a second time, as vec4s, after their other buffers.
            let wide = |defines: &[&str], format: WeightFormat| {
                (defines.contains(&"WIDE") && format.wide_binds_vec4()).then(|| Slice::from(chunk))
            };
            let gate_up_decode_io: Vec<Slice> =
                gate_up_io.iter().copied().chain(wide(&gate_up_defines, layout.format)).collect();
            let down_decode_io: Vec<Slice> =
                down_io.iter().copied().chain(wide(&down_defines, layout.down_format)).collect();
            gate_up.push(bind("expert_gate_up", &gate_up_defines, &gate_up_decode_io, gate_up_traffic));
            down.push(bind("expert_down", &down_defines, &down_decode_io, down_traffic));
            if prefill == ExpertPrefill::Gather {
                gather.push((
                    bind("expert_matmul", &gate_up_mm_defines, &gate_up_io, gate_up_traffic),
                    bind("expert_matmul", &down_mm_defines, &down_io, down_traffic),
                ));
            }
        }
        ExpertFfn { gate_up, down, gather, top_k, n_experts: slots.experts, hidden, inter, layout: decode }
    }

    /// Records the expert FFN for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        let pairs = n_tokens * self.top_k;
        let max = gpu.caps.max_workgroups_per_dim;
        if n_tokens > MATVEC_MAX_TOKENS && !self.gather.is_empty() {
            let (tile_rows, tile_pairs) = EXPERT_TILE;
            let groups =
                |rows: usize| (self.n_experts * rows.div_ceil(tile_rows) * n_tokens.div_ceil(tile_pairs)) as u32;
            // Each chunk's gate/up before any down: down reads h rows other chunks write.
            for (gate_up, _) in &self.gather {
                gate_up.dispatch(pass, groups(self.inter), max);
            }
            for (_, down) in &self.gather {
                down.dispatch(pass, groups(self.hidden), max);
            }
            return;
        }
        let gate_up_groups = pairs * self.inter.div_ceil(self.layout.rows_per_workgroup(GATE_UP_R) as usize);
        let down_groups = pairs * self.hidden.div_ceil(self.layout.rows_per_workgroup(DOWN_R) as usize);
        for k in &self.gate_up {
            k.dispatch(pass, gate_up_groups as u32, max);
        }
        for k in &self.down {
            k.dispatch(pass, down_groups as u32, max);
        }
    }
}
