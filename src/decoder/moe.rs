//! Binding an MoE layer's FFN: the router matmul and top-k, the routed experts over the slot
//! arena, the shared expert and, where the next norm cannot do it, the combine.

use super::*;
use crate::model::layer_weights::MoeWeights;

impl Builder<'_> {
    /// Binds MoE layer `i` (`mw`, its experts in `r`'s slots; hidden size `h`), reading `acts.hn` and adding
    /// into `acts.x`; also whether the next layer's input norm (or the final norm) is to add the
    /// experts' outputs (every layer without a gated shared expert).
    pub(super) fn moe_ffn(
        &mut self,
        m: &MoeSpec,
        h: usize,
        i: usize,
        mw: &MoeWeights,
        r: &ExpertResidency,
        acts: &Activations,
    ) -> Result<(MoeFfn, bool)> {
        let (gpu, step) = (self.gpu, self.step);
        let router_m = self.matrix("router", &mw.router)?;
        let logit_bias = mw.router_logit_bias.as_ref().map(|b| f32_buf(gpu, "router", b));
        let router_out = MatMulOut::plain(m.num_experts);
        let (matrix, logits) = (&self.matrices[router_m], &acts.router_logits);
        let router = MatMul::new(gpu, step, &acts.hn, matrix, logit_bias.as_ref(), logits, router_out);
        let router_bias = mw.router_bias.as_ref().map(|b| b.data.clone());
        let shape = router_shape(m, router_bias.as_deref());
        let topk = RouterTopK::new(gpu, step, acts.router_io(), shape);
        self.buffers.extend(logit_bias);
        let expert_bias = mw.expert_bias.as_ref().map(|b| f32_buf(gpu, "expert biases", b));
        let io = ExpertIo {
            x: &acts.hn,
            ids: &acts.ids,
            route_w: &acts.route_w,
            h: &acts.eh,
            y: &acts.ey,
            act: (m.expert_act, expert_bias.as_ref()),
        };
        let prefill = ExpertPrefill::for_layer(gpu, m.expert_act);
        let expert_ffn =
            ExpertFfn::new(gpu, step, io, r.arena.binding(&r.table), &r.layer_layout(i), i, m.top_k, prefill);
        self.buffers.extend(expert_bias);
        // A gated shared expert (Qwen2-MoE) writes its own buffer for the combine
        // to gate; an ungated one (DeepSeek, GLM) accumulates into the residual.
        let shared = match &mw.shared {
            Some((sw, gate)) => {
                let out = match gate {
                    Some(_) => (&acts.shared_out, false),
                    None => (&acts.x, true),
                };
                let mlp = self.mlp("shared expert", sw, &acts.hn, acts, out, (i, LoraTarget::SharedExpert))?;
                let gate = gate
                    .as_ref()
                    .map(|g| {
                        let out = MatMulOut::plain(1);
                        self.matmul("shared gate", g, None, &acts.hn, &acts.shared_gate, out)
                    })
                    .transpose()?;
                Some(Shared { mlp, gate })
            }
            None => None,
        };
        let gated = shared.as_ref().and_then(|s| s.gate.as_ref()).map(|_| (&acts.shared_out, &acts.shared_gate));
        let combine = gated.map(|_| MoeCombine::new(gpu, step, &acts.ey, &acts.x, gated, h, m.top_k));
        let combine_later = combine.is_none();
        Ok((MoeFfn { router, router_bias, topk, experts: expert_ffn, shared, combine }, combine_later))
    }
}
