//! Building a [`GpuModel`]: every resident weight uploaded, every kernel bound, layer by layer
//! (attention of each kind, dense or routed FFN, norms, the head), within the binding limits.

use super::*;
use crate::model::DeltaShape;
use crate::ops::gated_delta_rule::{chunk_scratch_bytes, CHUNK};

/// The router top-k's shape for `m`, with the layer's correction bias for sigmoid routing.
pub(super) fn router_shape<'a>(m: &MoeSpec, bias: Option<&'a [f32]>) -> RouterShape<'a> {
    RouterShape {
        n_experts: m.num_experts,
        top_k: m.top_k,
        renormalize: m.norm_topk_prob,
        groups: m.routing.groups(),
        routed_scale: m.routed_scaling_factor,
        sigmoid_bias: match m.routing {
            RoutingKind::SigmoidBiased { .. } => bias,
            _ => None,
        },
    }
}

pub(super) fn f32_buf(gpu: &Gpu, label: &str, t: &HostTensor) -> wgpu::Buffer {
    gpu.upload(label, bytemuck::cast_slice(&t.data))
}

/// The heads split decode attention leaves partials for: grouped attention's, or every MLA
/// query head with the width its cache accumulates (the latent's rank, or the value head).
fn partial_heads(spec: &ArchSpec) -> Heads {
    match spec.mla() {
        Some(m) => mla_attention::partial_heads(
            spec.heads,
            match m.cache {
                MlaCacheKind::Latent => m.kv_lora_rank,
                MlaCacheKind::Decompressed => m.v_head_dim,
            },
        ),
        None => Heads { n_heads: spec.heads, n_kv_heads: spec.kv_heads, head_dim: spec.head_dim },
    }
}

/// Checks the limits of the kernels against a spec.
fn check_supported(spec: &ArchSpec) -> Result<()> {
    if spec.head_dim > 256 || !spec.head_dim.is_multiple_of(2) {
        return Err(Error::UnsupportedConfig(format!(
            "head_dim {} (attention takes even sizes up to 256)",
            spec.head_dim
        )));
    }
    // Grouped attention reads a head in chunks of 8 dims (16-byte loads of an f16 row).
    if spec.mla().is_none() && !spec.head_dim.is_multiple_of(8) {
        return Err(Error::UnsupportedConfig(format!(
            "head_dim {} (grouped attention takes multiples of 8 up to 256)",
            spec.head_dim
        )));
    }
    if let Some(m) = spec.mla() {
        use crate::ops::mla_attention::{MAX_DECOMPRESSED_DIM, MAX_RANK, MAX_ROPE};
        // The cache store writes the latent and the rotary key in pairs.
        if m.kv_lora_rank > MAX_RANK || m.qk_rope_head_dim > MAX_ROPE || !m.kv_lora_rank.is_multiple_of(2) {
            return Err(Error::UnsupportedConfig(format!(
                "MLA kv_lora_rank {} / qk_rope_head_dim {} odd or above the kernel's {MAX_RANK} / {MAX_ROPE}",
                m.kv_lora_rank, m.qk_rope_head_dim
            )));
        }
        // The decompressed cache stores every head's key and value rows in pairs.
        let dims = [("qk_nope_head_dim", m.qk_nope_head_dim), ("v_head_dim", m.v_head_dim)];
        let odd = dims.into_iter().find(|(_, n)| !n.is_multiple_of(2) || *n > MAX_DECOMPRESSED_DIM);
        if let (MlaCacheKind::Decompressed, Some((what, n))) = (m.cache, odd) {
            return Err(Error::UnsupportedConfig(format!(
                "a decompressed MLA cache needs an even {what} up to {MAX_DECOMPRESSED_DIM}, not {n}"
            )));
        }
    }
    if let Some(hy) = &spec.hybrid {
        // The delta rule's output is `out_proj`'s input (the in-projection's width is a count
        // of rows, which any number may be).
        if !hy.value_dim().is_multiple_of(8) {
            return Err(Error::UnsupportedConfig(format!(
                "linear value width {} is not a multiple of 8",
                hy.value_dim()
            )));
        }
    }
    if let Some(m) = &spec.moe {
        if m.num_experts > 256 {
            return Err(Error::UnsupportedConfig(format!("{} experts per layer > 256", m.num_experts)));
        }
    }
    // Widths some matrix reads as its input (MLA: the compressed query and the attention output).
    let mla_inputs = spec.mla().map_or([0, 0], |m| [m.q_lora_rank.unwrap_or(0), spec.heads * m.v_head_dim]);
    let widths = [("hidden_size", spec.hidden), ("q width", spec.q_dim()), ("kv width", spec.kv_dim())];
    let mla_widths = [("q_lora_rank", mla_inputs[0]), ("heads * v_head_dim", mla_inputs[1])];
    for (what, n) in widths.into_iter().chain(mla_widths) {
        if n % 8 != 0 {
            return Err(Error::UnsupportedConfig(format!("{what} {n} is not a multiple of 8")));
        }
    }
    Ok(())
}

pub(super) struct Builder<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) step: &'a wgpu::Buffer,
    pub(super) options: DecoderOptions,
    pub(super) lora: Option<LoraBinding<'a>>,
    pub(super) buffers: Vec<wgpu::Buffer>,
    pub(super) matrices: Vec<GpuMatrix>,
    /// The layer being built (named in upload errors).
    pub(super) layer: Option<usize>,
}

impl Builder<'_> {
    pub(super) fn matrix(&mut self, label: &str, t: &HostTensor) -> Result<usize> {
        let m = match (&t.ggml, &t.shape[..]) {
            // A GGUF matrix is read in its own type, whatever the options say.
            (Some(g), &[rows, cols]) => GpuMatrix::upload_gguf(self.gpu, label, rows, cols, g.ggml_type, &g.bytes)?,
            _ => {
                GpuMatrix::upload(self.gpu, label, t, self.options.format_of(label)).map_err(|e| match self.layer {
                    Some(i) => naming(&format!("layer {i}"), e),
                    None => e,
                })?
            }
        };
        self.matrices.push(m);
        Ok(self.matrices.len() - 1)
    }

    pub(super) fn matmul(
        &mut self,
        label: &str,
        w: &HostTensor,
        bias: Option<&HostTensor>,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        out: MatMulOut,
    ) -> Result<MatMul> {
        let m = self.matrix(label, w)?;
        let bias = bias.map(|b| f32_buf(self.gpu, label, b));
        let mm = MatMul::new(self.gpu, self.step, x, &self.matrices[m], bias.as_ref(), y, out);
        self.buffers.extend(bias);
        Ok(mm)
    }

    /// A SwiGLU MLP from `x` into `out`, whose projections are the adapter targets `site`
    /// makes of layer `layer` (dense MLP or shared expert).
    pub(super) fn mlp(
        &mut self,
        label: &str,
        w: &MlpWeights,
        x: &wgpu::Buffer,
        acts: &Activations,
        (out, accumulate): (&wgpu::Buffer, bool),
        (layer, site): (usize, fn(MlpProj) -> LoraTarget),
    ) -> Result<Mlp> {
        let inter = w.gate.shape[0];
        let gu = self.matrix(label, &HostTensor::concat_rows(&[&w.gate, &w.up]))?;
        // The fused matrix holds the gate rows, then the up rows: each delta owns its columns.
        let gu_out = MatMulOut::plain(2 * inter);
        let base = MatMul::new(self.gpu, self.step, x, &self.matrices[gu], None, &acts.gu, gu_out);
        let gu_targets = [
            (site(MlpProj::Gate), gu_out, &acts.gu),
            (site(MlpProj::Up), MatMulOut { col_offset: inter, ..gu_out }, &acts.gu),
        ];
        let gate_up = self.with_lora(base, layer, &gu_targets, x)?;
        let swiglu = SwiGlu::new(self.gpu, self.step, &acts.gu, &acts.mh, inter);
        let down_out = MatMulOut { accumulate, ..MatMulOut::plain(w.down.shape[0]) };
        let down = self.projection(label, &w.down, None, &acts.mh, out, down_out, (layer, site(MlpProj::Down)))?;
        Ok(Mlp { gate_up, swiglu, down })
    }

    pub(super) fn norm(
        &mut self,
        weight: &HostTensor,
        x: &wgpu::Buffer,
        out: Option<&wgpu::Buffer>,
        rows: NormRows,
        eps: f32,
    ) -> RmsNorm {
        let w = f32_buf(self.gpu, "norm", weight);
        let n = RmsNorm::new(self.gpu, self.step, &w, x, out, rows, eps);
        self.buffers.push(w);
        n
    }

    /// Two in-place norms in one dispatch ([`RmsNorm::pair`]): a layer's q and k norms.
    pub(super) fn norm_pair(
        &mut self,
        (w1, x1, rows1): (&HostTensor, &wgpu::Buffer, NormRows),
        (w2, x2, rows2): (&HostTensor, &wgpu::Buffer, NormRows),
        eps: f32,
    ) -> RmsNorm {
        let (b1, b2) = (f32_buf(self.gpu, "norm", w1), f32_buf(self.gpu, "norm", w2));
        let n = RmsNorm::pair(self.gpu, self.step, (&b1, x1, rows1), (&b2, x2, rows2), eps);
        self.buffers.extend([b1, b2]);
        n
    }

    /// A layer's input norm that first adds the previous MoE layer's `top_k` expert outputs
    /// (`acts.ey`) into the residual: x += combine, hn = norm(x).
    pub(super) fn norm_after_combine(
        &mut self,
        weight: &HostTensor,
        acts: &Activations,
        top_k: usize,
        eps: f32,
    ) -> RmsNorm {
        let w = f32_buf(self.gpu, "norm", weight);
        let n =
            RmsNorm::after_combine(self.gpu, self.step, &w, &acts.x, &acts.hn, &acts.ey, weight.data.len(), top_k, eps);
        self.buffers.push(w);
        n
    }
}

/// What every layer's kernels bind besides their own weights: RoPE's tables, the attention
/// heads and split length of split-K decode, and the routed experts' slots.
pub(super) struct BoundShared<'a> {
    pub(super) tables: (&'a wgpu::Buffer, &'a wgpu::Buffer),
    pub(super) heads: Heads,
    pub(super) split_len: usize,
    pub(super) residency: Option<&'a ExpertResidency>,
}

impl Builder<'_> {
    /// Binds decoder layer `i` of `spec` from `w`: its input norm first adds the previous MoE
    /// layer's expert outputs (`combine_pending`, that layer's top-k) into the residual where
    /// set. Also returns the top-k whose combine the next norm is to do.
    pub(super) fn decoder_layer(
        &mut self,
        spec: &ArchSpec,
        i: usize,
        w: &LayerWeights,
        acts: &Activations,
        bound: &BoundShared<'_>,
        combine_pending: Option<usize>,
    ) -> Result<(Layer, Option<usize>)> {
        let (h, eps) = (spec.hidden, spec.rms_eps);
        let rows = NormRows { n: h, rows_per_token: 1, at_cache_pos: false };
        let attn_norm = match combine_pending {
            Some(top_k) => self.norm_after_combine(&w.input_norm, acts, top_k, eps),
            None => self.norm(&w.input_norm, &acts.x, Some(&acts.hn), rows, eps),
        };
        let attn = match (&w.attn, spec.mla()) {
            (AttentionBlock::Mla(mw), Some(m)) => {
                Attn::Mla(Box::new(self.mla(spec, m, mw, acts, bound.tables, bound.split_len)?))
            }
            (AttentionBlock::Linear(lw), _) => {
                let hy = spec.hybrid.as_ref().expect("linear weights are only read for a hybrid spec");
                Attn::Linear(Box::new(self.linear_attn(spec, hy, lw, acts)?))
            }
            (AttentionBlock::Grouped(attn), _) => {
                Attn::Grouped(Box::new(self.grouped_attn(spec, i, attn, acts, (bound.heads, bound.split_len))?))
            }
            (AttentionBlock::Mla(_), None) => unreachable!("MLA weights are only read for an MLA spec"),
        };
        let ffn_norm = self.norm(&w.post_norm, &acts.x, Some(&acts.hn), rows, eps);
        let mut pending = None;
        let ffn = match &w.ffn {
            FfnWeights::Dense(mlp) => {
                Ffn::Dense(self.mlp("mlp", mlp, &acts.hn, acts, (&acts.x, true), (i, LoraTarget::Mlp))?)
            }
            FfnWeights::Moe(mw) => {
                let m = spec.moe.as_ref().expect("MoE layer implies MoE spec");
                let r = bound.residency.expect("residency exists for MoE layers");
                let (ffn, combine_later) = self.moe_ffn(m, h, i, mw, r, acts)?;
                pending = combine_later.then_some(m.top_k);
                Ffn::Moe(Box::new(ffn))
            }
        };
        Ok((Layer { attn_norm, attn, ffn_norm, ffn }, pending))
    }
}

impl Activations {
    /// The activation buffers of steps of up to `b` tokens of `spec`, with `partials` bytes of
    /// split-K attention partials.
    fn allocate(gpu: &Gpu, spec: &ArchSpec, b: usize, partials: u64) -> Activations {
        let h = spec.hidden;
        let f = |n: usize| (n * 4) as u64;
        let moe = spec.moe.as_ref();
        let top_k = moe.map_or(1, |m| m.top_k);
        let inter_max = [spec.dense_intermediate, moe.and_then(|m| m.shared_expert_intermediate).unwrap_or(0)]
            .into_iter()
            .max()
            .unwrap_or(0)
            .max(8);
        let expert_inter = moe.map_or(8, |m| m.expert_intermediate);
        let n_experts = moe.map_or(1, |m| m.num_experts);
        // The in-projection, conv and value widths of a hybrid model's DeltaNet layers.
        let hybrid_widths = spec.hybrid.as_ref().map_or([1; 3], |hy| [hy.in_width(), hy.conv_dim(), hy.value_dim()]);
        Activations {
            tokens: gpu.storage("tokens", f(b)),
            targets: gpu.storage("targets", f(b)),
            x: gpu.storage("x", f(b * h)),
            hn: gpu.storage("hn", f(b * h)),
            q: gpu.storage("q", f(b * spec.q_dim())),
            k: gpu.storage("k", f(b * spec.kv_dim().max(spec.mla().map_or(0, |m| m.kv_lora_rank)))),
            v: gpu.storage("v", f(b * spec.kv_dim().max(spec.mla().map_or(0, |m| m.qk_rope_head_dim)))),
            q_lat: gpu.storage("q latent", f(b * spec.mla().and_then(|m| m.q_lora_rank).unwrap_or(1))),
            attn: gpu.storage(
                "attn",
                f(b * spec.q_dim().max(spec.mla().map_or(0, |m| spec.heads * m.v_head_dim)).max(hybrid_widths[2])),
            ),
            lin: gpu.storage("linear attention in", f(b * hybrid_widths[0].max(spec.q_dim()))),
            conv: gpu.storage("linear attention conv", f(b * hybrid_widths[1])),
            core: gpu.storage("linear attention core", f(b * hybrid_widths[2])),
            delta_chunks: gpu.storage(
                "delta rule chunks",
                spec.hybrid.as_ref().map_or(4, |hy| chunk_scratch_bytes(DeltaShape::of(hy), b)),
            ),
            attn_partial: gpu.storage("attention partials", partials),
            gu: gpu.storage("gu", f(b * 2 * inter_max)),
            mh: gpu.storage("mh", f(b * inter_max)),
            router_logits: gpu.storage("router logits", f(b * n_experts)),
            ids: gpu.storage("ids", f(b * top_k)),
            route_w: gpu.storage("route weights", f(b * top_k)),
            eh: gpu.storage("expert h", f(b * top_k * expert_inter)),
            ey: gpu.storage("expert y", f(b * top_k * h)),
            shared_out: gpu.storage("shared out", f(b * h)),
            shared_gate: gpu.storage("shared gate", f(b)),
            logits: gpu.storage("logits", f(b * spec.vocab)),
            logprobs: gpu.storage("logprobs", f(b)),
            argmax: gpu.storage("argmax", 4),
        }
    }
}

/// Where `spec`'s routed experts live on the GPU: every one resident, or a budget of slots
/// filled from `expert_source` as `options.streaming` says; `None` without MoE layers.
fn expert_residency(
    gpu: &Arc<Gpu>,
    spec: &ArchSpec,
    moe_layers: &[usize],
    expert_source: Option<Arc<dyn ExpertSource>>,
    options: &DecoderOptions,
    predicted: &PredictedRouting,
) -> Result<Option<ExpertResidency>> {
    let h = spec.hidden;
    let gpu = &**gpu;
    Ok(match &spec.moe {
        Some(m) if !moe_layers.is_empty() => {
            let source =
                expert_source.ok_or_else(|| Error::InvalidArgument("an MoE model needs an expert source".into()))?;
            let layout = source.layout();
            // The source decides down's format (GGUF experts may keep their own type there),
            // and holds GGUF blocks as the GPU reads them best.
            let asked = SlotLayout::mixed(options.experts.for_gpu(), layout.down_format, h, m.expert_intermediate)?;
            if layout.row_major() != asked {
                return Err(Error::InvalidArgument(format!(
                    "expert source holds {}, the decoder was asked for {}",
                    layout.format_name(),
                    options.experts.name()
                )));
            }
            let e = m.num_experts;
            let total = moe_layers.len() * e;
            let table = SlotTable::new(gpu, spec.layers, e);
            Some(match options.streaming.filter(|s| s.slots < total) {
                None => {
                    let arena = SlotArena::new(gpu, total, layout)?;
                    ExpertResidency::resident(gpu, arena, table, source, moe_layers, e)?
                }
                Some(st) => {
                    if st.slots < m.top_k {
                        return Err(Error::InvalidArgument(format!(
                            "an expert budget of {} slots is below one layer's top-k ({}); the minimum is {}",
                            st.slots, m.top_k, m.top_k
                        )));
                    }
                    let arena = SlotArena::new(gpu, st.slots, layout)?;
                    let tracker = EamTracker::new(spec.layers, e, st.eamc_capacity, DEFAULT_MATCHES);
                    let predictor = st.prefetch.build_with(predicted);
                    let cache =
                        CacheModel::new(st.slots, spec.layers, e, st.policy.build(st.slots)?, predictor, tracker);
                    ExpertResidency::streaming(arena, table, source, cache, st.io_threads)
                }
            })
        }
        _ => None,
    })
}

impl GpuModel {
    /// Uploads the non-expert weights of `ckpt` and every routed expert from `experts`, and
    /// the pairs of `lora` (applied unmerged after the projections they adapt).
    pub fn load(
        gpu: Arc<Gpu>,
        spec: &ArchSpec,
        ckpt: &Checkpoint,
        expert_source: Option<Arc<dyn ExpertSource>>,
        options: DecoderOptions,
        lora: Option<&LoraAdapter>,
    ) -> Result<GpuModel> {
        let (model, bytes) =
            counting_allocations(|| GpuModel::build(gpu.clone(), spec, ckpt, expert_source, options, lora));
        match model {
            Ok(mut m) => {
                m.allocated = bytes;
                Ok(m)
            }
            Err(e) => {
                gpu.release_allocation(bytes);
                Err(e)
            }
        }
    }

    fn build(
        gpu: Arc<Gpu>,
        spec: &ArchSpec,
        ckpt: &Checkpoint,
        expert_source: Option<Arc<dyn ExpertSource>>,
        options: DecoderOptions,
        lora: Option<&LoraAdapter>,
    ) -> Result<GpuModel> {
        check_supported(spec)?;
        if lora.is_some() && spec.hybrid.is_some() {
            return Err(Error::UnsupportedConfig(
                "LoRA adapters on hybrid linear-attention models are not implemented".into(),
            ));
        }
        let h = spec.hidden;
        // Within a binding: the step's logits, and the chunked delta rule's scratch.
        let logits_fit = (gpu.caps.max_binding / (spec.vocab as u64 * 4)).max(1) as usize;
        let chunks_fit = spec.hybrid.as_ref().map_or(usize::MAX, |hy| {
            let per_chunk = chunk_scratch_bytes(DeltaShape::of(hy), CHUNK);
            (gpu.caps.max_binding / per_chunk).max(1) as usize * CHUNK
        });
        // CPU layouts run a prefill step's tokens through the decode matvec in one invocation.
        let matvec_fit = match gpu.caps.cpu_layouts && !gpu.caps.tiled_prefill {
            true => crate::ops::matmul::software_step_limit(spec.widest_dense_input()),
            false => usize::MAX,
        };
        let max_batch = options.max_batch.clamp(1, logits_fit.min(chunks_fit).min(matvec_fit));
        if max_batch < options.max_batch {
            log::info!("steps of at most {max_batch} tokens (of {} asked) on this adapter", options.max_batch);
        }
        let options = DecoderOptions { max_batch, ..options };
        let b = max_batch;
        let moe = spec.moe.clone();
        let top_k = moe.as_ref().map_or(1, |m| m.top_k);
        let f = |n: usize| (n * 4) as u64;
        let heads = partial_heads(spec);
        cache::check_layout(spec, options.cache_shape(), options.kv_dtype, gpu.caps.max_binding)?;
        let split_len = split_len(&gpu, heads, options.context);
        let acts = Activations::allocate(&gpu, spec, b, partial_bytes(heads, options.context, split_len));
        let step = StepUniform::new(&gpu);
        let lora = lora
            .map(|adapter| LoraBinding { adapter, tmp: gpu.storage("lora A x", f(b * padded_rank(adapter.rank()))) });
        let mut bld = Builder {
            gpu: &gpu,
            step: &step.buffer,
            options,
            lora,
            buffers: Vec::new(),
            matrices: Vec::new(),
            layer: None,
        };

        let (embed_w, final_norm_w, head_w) = layer_weights::globals_to_upload(ckpt, spec)?;
        let embed_m = bld.matrix("embed", &embed_w)?;
        let embed = Embed::new(&gpu, &step.buffer, &acts.tokens, &bld.matrices[embed_m], &acts.x);
        let embed_from_argmax = Embed::new(&gpu, &step.buffer, &acts.argmax, &bld.matrices[embed_m], &acts.x);
        drop(embed_w);

        let (cos, sin) = spec.rope.tables(options.context);
        let cos = gpu.upload("rope cos", bytemuck::cast_slice(&cos));
        let sin = gpu.upload("rope sin", bytemuck::cast_slice(&sin));

        let moe_layers: Vec<usize> = (0..spec.layers).filter(|&i| spec.is_moe_layer(i)).collect();
        // With the MTP module, its layer is one more: in the caches, and its experts in the slots.
        let mtp = options.mtp.then(|| crate::model::mtp::read(ckpt, spec)).transpose()?;
        let mtp_spec = mtp.as_ref().map(|(full, _)| full);
        let slotted: Vec<usize> = match mtp_spec {
            Some(full) => (0..full.layers).filter(|&i| full.is_moe_layer(i)).collect(),
            None => moe_layers.clone(),
        };
        let predicted = PredictedRouting::default();
        let residency =
            expert_residency(&gpu, mtp_spec.unwrap_or(spec), &slotted, expert_source, &options, &predicted)?;

        let mut layers = Vec::with_capacity(spec.layers);
        // The top-k of the previous MoE layer whose combine this layer's input norm does.
        let mut combine_pending = None;
        let bound = BoundShared { tables: (&cos, &sin), heads, split_len, residency: residency.as_ref() };
        for i in 0..spec.layers {
            bld.layer = Some(i);
            let w = layer_weights::layer(ckpt, spec, i)?;
            let (layer, pending) = bld.decoder_layer(spec, i, &w, &acts, &bound, combine_pending)?;
            combine_pending = pending;
            layers.push(layer);
        }
        bld.layer = None;
        let mtp =
            mtp.map(|(full, weights)| bld.mtp_module(full, &weights, (&acts, &step.buffer), &bound)).transpose()?;
        let final_norm = match combine_pending.take() {
            Some(top_k) => bld.norm_after_combine(&final_norm_w, &acts, top_k, spec.rms_eps),
            None => bld.norm(
                &final_norm_w,
                &acts.x,
                Some(&acts.hn),
                NormRows { n: h, rows_per_token: 1, at_cache_pos: false },
                spec.rms_eps,
            ),
        };
        let lm_head = bld.matmul("lm_head", &head_w, None, &acts.hn, &acts.logits, MatMulOut::plain(spec.vocab))?;
        let lm_head_last = MatMul::new(
            &gpu,
            &step.buffer,
            &acts.hn,
            bld.matrices.last().expect("the lm_head matrix was just uploaded"),
            None,
            &acts.logits,
            MatMulOut { last_token: true, ..MatMulOut::plain(spec.vocab) },
        );
        let argmax = Argmax::new(&gpu, &step.buffer, &acts.logits, &acts.argmax, spec.vocab);
        let token_logprob =
            TokenLogprob::new(&gpu, &step.buffer, &acts.logits, &acts.targets, &acts.logprobs, spec.vocab);
        let readback = Readback::new(&gpu, f((spec.vocab * super::step::LOGIT_ROWS).max(b)));
        let routing_readback = Readback::new(&gpu, f(b * top_k));
        let routing_log = Readback::new(&gpu, f(moe_layers.len() * top_k + 1));
        let chain = super::chained::ChainStaging::new(&gpu);
        let attention_merge =
            AttentionMerge::new(&gpu, &step.buffer, (&acts.attn_partial, &acts.attn), None, heads, split_len);
        let batch = super::batch::BatchBuffers::allocate(&gpu, spec, &acts, layers.iter().map(|l| &l.attn), b);
        let Builder { mut buffers, matrices, lora, .. } = bld;
        buffers.extend(lora.map(|l| l.tmp));
        gpu.wait()?;
        Ok(GpuModel {
            gpu,
            spec: spec.clone(),
            options,
            step,
            acts,
            embed,
            embed_from_argmax,
            layers,
            final_norm,
            lm_head,
            lm_head_last,
            rope_tables: (cos, sin),
            argmax,
            token_logprob,
            readback,
            routing_readback,
            routing_log,
            moe_layers,
            optimism: super::optimistic::Optimism::new(super::optimistic::OptimisticSteps::from_env()?),
            chain,
            split_len,
            attention_merge,
            batch,
            allocated: 0,
            kv_ledger: super::kv_ledger::KvLedger::new(options.kv_budget),
            last_step_end: Mutex::new(None),
            _buffers: buffers,
            matrices,
            experts: residency.map(Mutex::new),
            observer: Mutex::new(None),
            mtp,
            predicted,
            prerouter: None,
        })
    }
}
