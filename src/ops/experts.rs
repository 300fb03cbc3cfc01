//! The routed-expert FFN of one MoE layer over the slot arena: gate/up + SwiGLU, then down
//! scaled by the routing weight. One dispatch pair per arena chunk, one workgroup per (token
//! expert pair, block of rows) laid out as the decode matvec ([`DecodeLayout`]).

use super::matmul::DecodeLayout;
use super::params;
use crate::experts::{SlotArena, SlotLayout, SlotTable};
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel};
use crate::model::ExpertAct;

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

/// Rows per team (`R`) of `expert_down` in the (`LaneRows`, `Teams`) layouts, as in its shader.
const DOWN_R: (u32, u32) = (8, 2);

/// A bound expert FFN for one layer.
pub struct ExpertFfn {
    gate_up: Vec<Kernel>,
    down: Vec<Kernel>,
    top_k: usize,
    hidden: usize,
    inter: usize,
    layout: DecodeLayout,
}

impl ExpertFfn {
    /// Binds layer `layer`'s experts (found through `table`) in `arena`, laid out within
    /// each slot as `layout` says (the layer's own formats; the arena's slots may be larger).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        io: ExpertIo<'_>,
        arena: &SlotArena,
        layout: &SlotLayout,
        table: &SlotTable,
        layer: usize,
        top_k: usize,
    ) -> ExpertFfn {
        debug_assert!(layout.slot_bytes <= arena.layout.slot_bytes, "a layer's experts fit the arena's slots");
        let decode = DecodeLayout::for_gpu(gpu);
        let with_decode = |format: crate::ops::WeightFormat| {
            let mut d = format.defines();
            d.extend(decode.defines());
            d
        };
        let (mut gate_up_defines, mut down_defines) = (with_decode(layout.format), with_decode(layout.down_format));
        let (alpha, limit, bias) = match io.act {
            (ExpertAct::ClampedSwiGlu { alpha, limit }, Some(bias)) => {
                gate_up_defines.push("CLAMPED");
                down_defines.push("CLAMPED");
                (alpha, limit, Some(bias))
            }
            (ExpertAct::ClampedSwiGlu { .. }, None) => panic!("clamped SwiGLU experts need their biases"),
            (ExpertAct::SwiGlu, _) => (0.0, 0.0, None),
        };
        let (hidden, inter) = (layout.hidden, layout.inter);
        let proj: Vec<u32> = (0..3)
            .flat_map(|i| {
                let o = layout.proj_offsets(i).expect("slot layout was validated when the arena was made");
                [o.data, o.scales, o.mins, 0]
            })
            .collect();
        let mut gate_up = Vec::new();
        let mut down = Vec::new();
        for (c, chunk) in arena.chunks.iter().enumerate() {
            let first = c * arena.slots_per_chunk;
            let mut words = vec![
                hidden as u32,
                inter as u32,
                top_k as u32,
                table.base(layer) as u32,
                first as u32,
                arena.slots_per_chunk.min(arena.slots - first) as u32,
                (arena.layout.slot_bytes / 4) as u32,
                0,
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
            gate_up.push(
                Kernel::new(
                    gpu,
                    "expert_gate_up",
                    &gate_up_defines,
                    step,
                    &p,
                    &[io.x.into(), io.ids.into(), (&table.buffer).into(), chunk.into(), io.h.into()]
                        .into_iter()
                        .chain(bias.map(|b| b.into()))
                        .collect::<Vec<_>>(),
                )
                .with_traffic(gate_up_traffic),
            );
            down.push(
                Kernel::new(
                    gpu,
                    "expert_down",
                    &down_defines,
                    step,
                    &p,
                    &[io.h.into(), io.ids.into(), io.route_w.into(), (&table.buffer).into(), chunk.into(), io.y.into()]
                        .into_iter()
                        .chain(bias.map(|b| b.into()))
                        .collect::<Vec<_>>(),
                )
                .with_traffic(down_traffic),
            );
        }
        ExpertFfn { gate_up, down, top_k, hidden, inter, layout: decode }
    }

    /// Records the expert FFN for `n_tokens` tokens.
    pub fn record(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>, n_tokens: usize) {
        let pairs = n_tokens * self.top_k;
        let max = gpu.caps.max_workgroups_per_dim;
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
