//! The projections an adapter may target: their module paths in a checkpoint, their shapes and
//! where their weights live in [`LayerWeights`].

use crate::model::layer_weights::{AttentionBlock, FfnWeights, LayerWeights, MlpWeights};
use crate::model::{names, ArchSpec, HostTensor};

/// One projection of a SwiGLU MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MlpProj {
    /// `gate_proj`, `[intermediate, hidden]`.
    Gate,
    /// `up_proj`, `[intermediate, hidden]`.
    Up,
    /// `down_proj`, `[hidden, intermediate]`.
    Down,
}

/// A projection of one layer that a LoRA pair modifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraTarget {
    /// `self_attn.q_proj`.
    Q,
    /// `self_attn.k_proj`.
    K,
    /// `self_attn.v_proj`.
    V,
    /// `self_attn.o_proj`.
    O,
    /// A projection of a dense layer's MLP (`mlp.*_proj`).
    Mlp(MlpProj),
    /// A projection of an MoE layer's shared expert (`mlp.shared_expert.*_proj`, Qwen2-MoE).
    SharedExpert(MlpProj),
}

/// The three projections of an MLP.
pub(super) const MLP_PROJS: [MlpProj; 3] = [MlpProj::Gate, MlpProj::Up, MlpProj::Down];

impl MlpProj {
    fn name(self) -> &'static str {
        match self {
            MlpProj::Gate => "gate_proj",
            MlpProj::Up => "up_proj",
            MlpProj::Down => "down_proj",
        }
    }

    fn weight_mut(self, m: &mut MlpWeights) -> &mut HostTensor {
        match self {
            MlpProj::Gate => &mut m.gate,
            MlpProj::Up => &mut m.up,
            MlpProj::Down => &mut m.down,
        }
    }

    /// `(out, in)` of this projection in an MLP of width `inter` over `hidden`.
    fn shape(self, hidden: usize, inter: usize) -> (usize, usize) {
        match self {
            MlpProj::Down => (hidden, inter),
            _ => (inter, hidden),
        }
    }
}

impl LoraTarget {
    /// Every target layer `layer` of `spec` has: the attention projections (grouped attention
    /// only), then the dense MLP's or the shared expert's (MoE layers without a shared expert
    /// have no FFN target).
    pub fn of_layer(spec: &ArchSpec, layer: usize) -> Vec<LoraTarget> {
        // MLA's projections (q_a/q_b, kv_a, kv_b, o) are not adaptable: an adapter naming them
        // is refused at load.
        let mut out = match spec.mla() {
            None => vec![LoraTarget::Q, LoraTarget::K, LoraTarget::V, LoraTarget::O],
            Some(_) => Vec::new(),
        };
        let ffn = match (&spec.moe, spec.is_moe_layer(layer)) {
            (_, false) => Some(LoraTarget::Mlp as fn(MlpProj) -> LoraTarget),
            (Some(m), true) if m.shared_expert_intermediate.is_some() => Some(LoraTarget::SharedExpert as _),
            _ => None,
        };
        out.extend(ffn.into_iter().flat_map(|f| MLP_PROJS.map(f)));
        out
    }

    /// The module path of this target in layer `layer` (`model.layers.3.self_attn.q_proj`).
    pub fn module(self, spec: &ArchSpec, layer: usize) -> String {
        let p = names::layer(layer);
        match self {
            LoraTarget::Q => format!("{p}.self_attn.q_proj"),
            LoraTarget::K => format!("{p}.self_attn.k_proj"),
            LoraTarget::V => format!("{p}.self_attn.v_proj"),
            LoraTarget::O => format!("{p}.self_attn.o_proj"),
            LoraTarget::Mlp(m) => format!("{p}.mlp.{}", m.name()),
            LoraTarget::SharedExpert(m) => format!("{}.{}", names::shared_expert(spec.family, layer), m.name()),
        }
    }

    /// `(out, in)` of the adapted weight in `spec` (`[out, in]`, as the checkpoint stores it).
    pub fn shape(self, spec: &ArchSpec) -> (usize, usize) {
        let (h, qd, kvd) = (spec.hidden, spec.q_dim(), spec.kv_dim());
        match self {
            LoraTarget::Q => (qd, h),
            LoraTarget::K | LoraTarget::V => (kvd, h),
            LoraTarget::O => (h, qd),
            LoraTarget::Mlp(m) => m.shape(h, spec.dense_intermediate),
            LoraTarget::SharedExpert(m) => {
                m.shape(h, spec.moe.as_ref().and_then(|m| m.shared_expert_intermediate).unwrap_or(0))
            }
        }
    }

    /// The weight this target adapts in `w`, `None` when the layer has no such projection.
    pub fn weight_mut(self, w: &mut LayerWeights) -> Option<&mut HostTensor> {
        let attn = match &mut w.attn {
            AttentionBlock::Grouped(a) => Some(a),
            AttentionBlock::Mla(_) | AttentionBlock::Linear(_) => None,
        };
        match (self, &mut w.ffn) {
            (LoraTarget::Q, _) => attn.map(|a| &mut a.q),
            (LoraTarget::K, _) => attn.map(|a| &mut a.k),
            (LoraTarget::V, _) => attn.map(|a| &mut a.v),
            (LoraTarget::O, _) => attn.map(|a| &mut a.o),
            (LoraTarget::Mlp(p), FfnWeights::Dense(m)) => Some(p.weight_mut(m)),
            (LoraTarget::SharedExpert(p), FfnWeights::Moe(moe)) => moe.shared.as_mut().map(|(m, _)| p.weight_mut(m)),
            _ => None,
        }
    }
}
