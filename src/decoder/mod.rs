//! The generic decoder on the GPU, built from the ops for any [`ArchSpec`]: weights uploaded
//! once, every kernel bound once, each step records the same dispatch list for its token count.

mod batch;
mod build;
mod cache;
mod chained;
mod draft_states;
mod drafts;
mod footprint;
mod grouped;
mod kv_ledger;
mod linear;
mod mla;
mod moe;
mod mtp;
mod optimistic;
mod prerouter;
mod projection;
mod ring;
mod state_copy;
mod step;

use build::{f32_buf, router_shape, Builder};

pub use batch::{BatchEntry, Rows};
pub use cache::{GroupedCache, LayerCache, LinearCache, MlaCache, SequenceCache};
pub use chained::ChainedStep;
pub use draft_states::TOKEN_STATE_ROWS;
pub use mtp::{DraftNoise, MAX_DRAFTS as MAX_MTP_DRAFTS};
pub use optimistic::OptimisticSteps;
pub use prerouter::RoutingMode;

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::experts::arena::SlotLayout;
use crate::experts::cache_model::CacheModel;
use crate::experts::eam::{EamTracker, DEFAULT_MATCHES};
use crate::experts::policy::PolicyKind;
use crate::experts::predictor::{PredictedRouting, PrefetchKind};
use crate::experts::residency::ExpertResidency;
use crate::experts::route_memory::RouteMemory;
use crate::experts::source::ExpertSource;
use crate::experts::{SlotArena, SlotTable};
use crate::gpu::context::counting_allocations;
use crate::gpu::{Gpu, Pass, Readback, StepUniform};
use crate::model::layer_weights::{self, AttentionBlock, FfnWeights, LayerWeights, MlpWeights};
use crate::model::lora::{LoraAdapter, LoraTarget, MlpProj};
use crate::model::{ArchSpec, CacheShape, Checkpoint, HostTensor, MlaCacheKind, MoeSpec, QkNorm, RoutingKind};
use crate::ops::argmax::Argmax;
use crate::ops::attention::{partial_bytes, split_len, Heads};
use crate::ops::attention_merge::AttentionMerge;
use crate::ops::embed::Embed;
use crate::ops::experts::{ExpertFfn, ExpertIo, ExpertPrefill};
use crate::ops::matmul::{MatMul, MatMulOut};
use crate::ops::matrix::naming;
use crate::ops::mla_attention;
use crate::ops::moe_combine::MoeCombine;
use crate::ops::rms_norm::{NormRows, RmsNorm};
use crate::ops::router::{RouterIo, RouterShape, RouterTopK};
use crate::ops::swiglu::SwiGlu;
use crate::ops::token_logprob::TokenLogprob;
use crate::ops::{GpuMatrix, KvDtype, WeightFormat};
use projection::{padded_rank, LoraBinding, Projection};

/// How the decoder is built.
#[derive(Clone, Copy, Debug)]
pub struct DecoderOptions {
    /// Format of the routed experts.
    pub experts: WeightFormat,
    /// Format of attention, dense and shared-expert projections and the lm_head.
    pub dense: WeightFormat,
    /// Longest sequence (KV cache rows).
    pub context: usize,
    /// Element type of the KV caches.
    pub kv_dtype: KvDtype,
    /// GPU bytes the caches of all live sequences may take together.
    pub kv_budget: u64,
    /// Most tokens one step processes (prefill chunk).
    pub max_batch: usize,
    /// Sliding-window layers keep a ring of their window and a step, not every position.
    pub window_rings: bool,
    /// Snapshots of the linear-attention states each sequence may keep (`state_copy`).
    pub state_snapshots: usize,
    /// Stream experts through a slot budget; `None` keeps every expert resident.
    pub streaming: Option<StreamingOptions>,
    /// Also load and run the checkpoint's MTP module ([`crate::model::mtp`]): drafts for
    /// speculative decoding ([`GpuModel::mtp_drafts`]); its layer counts in the caches and slots.
    pub mtp: bool,
}

/// How routed experts are streamed when they do not all get a slot.
#[derive(Clone, Copy, Debug)]
pub struct StreamingOptions {
    /// GPU slots for experts (at least one layer's top-k). A budget holding every expert means
    /// fully resident.
    pub slots: usize,
    /// Eviction policy.
    pub policy: PolicyKind,
    /// Prefetch predictor.
    pub prefetch: PrefetchKind,
    /// Reader threads.
    pub io_threads: usize,
    /// Capacity of the EAMC collection.
    pub eamc_capacity: usize,
}

impl DecoderOptions {
    /// How each sequence's caches are laid out.
    pub fn cache_shape(&self) -> CacheShape {
        CacheShape {
            context: self.context,
            max_step: self.max_batch,
            rings: self.window_rings,
            state_copy: self.streaming.is_some(),
        }
    }

    /// The format of the matrix with role `label`: routed experts use `experts`; embeddings
    /// and routers are never int4 (lookups and routing decisions stay precise, f16 instead);
    /// everything else (attention, dense and shared FFNs, lm_head) uses `dense`.
    pub fn format_of(&self, label: &str) -> WeightFormat {
        match (label, self.dense) {
            ("experts", _) => self.experts,
            ("embed" | "router", WeightFormat::Int4(_)) => WeightFormat::F16,
            _ => self.dense,
        }
    }
}

/// What a step should produce besides updating the KV cache.
#[derive(Clone, Copy, Debug)]
pub enum StepOutput<'a> {
    /// Nothing (prefill of tokens whose logits nobody needs).
    None,
    /// The greedy next token after the step's last token.
    Argmax,
    /// The full logits of the step's last token.
    Logits,
    /// The full logits of every token of the step (verifying draft tokens).
    AllLogits,
    /// `log p(targets[i] | tokens[..=i])` for every token of the step.
    LogProbs(&'a [u32]),
}

/// A step's result, matching the requested [`StepOutput`].
#[derive(Clone, Debug, PartialEq)]
pub enum StepResult {
    /// No output requested.
    None,
    /// The greedy token.
    Token(u32),
    /// Logits of the last token.
    Logits(Vec<f32>),
    /// Logits of every token.
    AllLogits(Vec<Vec<f32>>),
    /// Per-token log-probabilities.
    LogProbs(Vec<f32>),
}

impl StepResult {
    /// The logits, where the step asked for them.
    pub fn into_logits(self) -> Option<Vec<f32>> {
        match self {
            StepResult::Logits(l) => Some(l),
            _ => None,
        }
    }
}

struct Mlp {
    gate_up: Projection,
    swiglu: SwiGlu,
    down: Projection,
}

struct Shared {
    mlp: Mlp,
    /// Qwen2-MoE's sigmoid gate logit; `None` when the shared expert adds straight into `x`.
    gate: Option<MatMul>,
}

struct MoeFfn {
    router: MatMul,
    /// The router's correction bias (sigmoid routing), kept for routers bound later.
    router_bias: Option<Vec<f32>>,
    topk: RouterTopK,
    experts: ExpertFfn,
    shared: Option<Shared>,
    /// Sum of the experts' outputs into the residual; `None` when the next layer's input norm
    /// (or the final norm) does it ([`RmsNorm::after_combine`]: every layer without a gated
    /// shared expert).
    combine: Option<MoeCombine>,
}

enum Ffn {
    Dense(Mlp),
    Moe(Box<MoeFfn>),
}

/// Grouped-query attention's shared part: projections into `acts.k`/`acts.v`, norms, RoPE and
/// `o_proj`; the cache store and the attention are bound per session ([`cache::GroupedCache`]).
struct GroupedAttn {
    /// The query, key and value projections: one fused matmul, or three.
    qkv: Vec<Projection>,
    /// The per-head or whole-projection q and k norms, one paired dispatch, before RoPE (which
    /// the session's cache store applies, `KvStore`'s ROPE).
    qk_norm: Option<RmsNorm>,
    /// The output gate of gated attention (Qwen3-Next/3.5), applied before `o_proj`.
    out_gate: Option<linear::OutputGate>,
    o: Projection,
    /// Attention sinks `[heads]` (gpt-oss), bound by each session's attention, and the split
    /// decode merge that applies them.
    sinks: Option<(wgpu::Buffer, AttentionMerge)>,
}

/// A layer's attention, by kind.
enum Attn {
    Grouped(Box<GroupedAttn>),
    Mla(Box<mla::MlaAttn>),
    /// Linear attention (Gated DeltaNet, KDA): its state is the session's
    /// ([`cache::LinearCache`]).
    Linear(Box<linear::LinearAttn>),
}

struct Layer {
    attn_norm: RmsNorm,
    attn: Attn,
    ffn_norm: RmsNorm,
    ffn: Ffn,
}

/// Activation buffers, sized for `max_batch` tokens.
struct Activations {
    tokens: wgpu::Buffer,
    targets: wgpu::Buffer,
    x: wgpu::Buffer,
    hn: wgpu::Buffer,
    q: wgpu::Buffer,
    /// Keys (grouped) or MLA's normalised latent, before the cache store.
    k: wgpu::Buffer,
    /// Values (grouped) or MLA's rotated rotary key, before the cache store.
    v: wgpu::Buffer,
    /// MLA's compressed query (`q_lora_rank` wide).
    q_lat: wgpu::Buffer,
    /// Linear attention's in-projection `[q | k | v | z | b | a]`, or an attention output gate.
    lin: wgpu::Buffer,
    /// Gated DeltaNet's conv output (q | k | v).
    conv: wgpu::Buffer,
    /// Gated DeltaNet's delta-rule output, before the gated norm.
    core: wgpu::Buffer,
    /// The chunked delta rule's scratch ([`crate::ops::gated_delta_rule::chunk_scratch_bytes`]).
    delta_chunks: wgpu::Buffer,
    attn: wgpu::Buffer,
    /// Split decode attention's partials (see [`partial_bytes`]).
    attn_partial: wgpu::Buffer,
    gu: wgpu::Buffer,
    mh: wgpu::Buffer,
    router_logits: wgpu::Buffer,
    ids: wgpu::Buffer,
    route_w: wgpu::Buffer,
    eh: wgpu::Buffer,
    ey: wgpu::Buffer,
    shared_out: wgpu::Buffer,
    shared_gate: wgpu::Buffer,
    logits: wgpu::Buffer,
    logprobs: wgpu::Buffer,
    argmax: wgpu::Buffer,
}

impl Activations {
    /// The router top-k's buffers.
    fn router_io(&self) -> RouterIo<'_> {
        RouterIo { logits: &self.router_logits, ids: &self.ids, weights: &self.route_w }
    }
}

/// Called after each MoE layer's router + top-k with the layer index, that layer's FFN input
/// (`hn`: the post-attention RMSNorm output, tokens × hidden f32) and its routed ids
/// (tokens × top-k), for every token of the step. Used to collect prerouter training data.
pub type LayerObserver = Box<dyn FnMut(usize, &[f32], &[u32]) + Send>;

/// An installed [`LayerObserver`] and the staging buffer its `hn` rows come back through.
struct Observer {
    callback: LayerObserver,
    readback: Readback,
}

/// A model resident on the GPU, ready to run steps.
pub struct GpuModel {
    gpu: Arc<Gpu>,
    spec: ArchSpec,
    options: DecoderOptions,
    step: StepUniform,
    acts: Activations,
    embed: Embed,
    /// The embedding of the greedy token the previous step left in `acts.argmax` (chained steps).
    embed_from_argmax: Embed,
    layers: Vec<Layer>,
    final_norm: RmsNorm,
    lm_head: MatMul,
    /// The lm_head on the step's last token only (greedy token, last logits).
    lm_head_last: MatMul,
    argmax: Argmax,
    token_logprob: TokenLogprob,
    readback: Readback,
    routing_readback: Readback,
    /// Every MoE layer's routed ids of an optimistic step ([`optimistic`]).
    routing_log: Readback,
    /// The indices of the layers that run routed experts, in order.
    moe_layers: Vec<usize>,
    /// When streaming decode steps run optimistically.
    optimism: optimistic::Optimism,
    /// Staging for chained greedy steps ([`GpuModel::submit_chained`]).
    chain: chained::ChainStaging,
    /// Keys per split of decode attention.
    split_len: usize,
    attention_merge: AttentionMerge,
    /// Step values and row copies of batched steps ([`batch`]).
    batch: batch::BatchBuffers,
    /// RoPE's cos and sin tables (`RopeSpec::tables`), which grouped layers' cache stores bind.
    rope_tables: (wgpu::Buffer, wgpu::Buffer),
    /// GPU bytes the model allocated, given back to the context when it is dropped.
    allocated: u64,
    kv_ledger: Arc<kv_ledger::KvLedger>,
    /// The sequence and position the last step ended at (the prerouter's history belongs to it).
    last_step_end: Mutex<Option<(u64, usize)>>,
    /// Keeps every weight and cache buffer alive for the bind groups.
    _buffers: Vec<wgpu::Buffer>,
    /// Every weight matrix on the GPU, the embedding table first.
    matrices: Vec<GpuMatrix>,
    experts: Option<Mutex<ExpertResidency>>,
    observer: Mutex<Option<Observer>>,
    /// The MTP module, when loaded.
    mtp: Option<mtp::MtpModule>,
    predicted: PredictedRouting,
    prerouter: Option<prerouter::DecoderPrerouter>,
}

impl Drop for GpuModel {
    fn drop(&mut self) {
        self.gpu.release_allocation(self.allocated);
    }
}

impl GpuModel {
    /// The architecture.
    pub fn spec(&self) -> &ArchSpec {
        &self.spec
    }

    /// A memory of one sequence's routing ([`RouteMemory`]) when this model's experts stream;
    /// `None` when they do not (nothing to read ahead) or it has none.
    pub fn new_route_memory(&self) -> Option<RouteMemory> {
        let moe = self.spec.moe.as_ref()?;
        if !self.residency().is_some_and(|r| r.is_streaming()) {
            return None;
        }
        RouteMemory::new(&self.moe_layers, moe.top_k, moe.num_experts, self.options.context)
    }

    /// The options the model was built with (`max_batch` possibly lowered to fit).
    pub fn options(&self) -> DecoderOptions {
        self.options
    }

    /// The GPU context.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// The attention head layout.
    fn heads(&self) -> Heads {
        Heads { n_heads: self.spec.heads, n_kv_heads: self.spec.kv_heads, head_dim: self.spec.head_dim }
    }

    /// Where a [`PrefetchKind::Prerouter`] predictor reads its predictions (written after each
    /// step by attached prerouter heads, see [`GpuModel::attach_prerouter`]).
    pub fn predicted_routing(&self) -> &PredictedRouting {
        &self.predicted
    }

    /// Installs (or with `None` removes) the per-MoE-layer observer. While one is installed,
    /// every step reads each MoE layer's `hn` and routed ids back to the CPU (one submission
    /// per MoE layer, as when streaming); the output is unchanged.
    pub fn set_observer(&self, callback: Option<LayerObserver>) {
        let bytes = (self.options.max_batch * self.spec.hidden * 4) as u64;
        *self.observer.lock().expect("observer lock") =
            callback.map(|callback| Observer { callback, readback: Readback::new(&self.gpu, bytes) });
    }
}

impl GroupedAttn {
    /// Records the projections and norms that leave the step's queries in `acts.q` and its
    /// keys/values in `acts.k`/`acts.v` for the session's cache store (which applies RoPE).
    fn record_inputs(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        for p in &self.qkv {
            p.record(gpu, pass, n);
        }
        if let Some(qk) = &self.qk_norm {
            qk.record(gpu, pass, n);
        }
        if let Some(g) = &self.out_gate {
            g.record_projection(gpu, pass, n);
        }
    }
}

impl Attn {
    /// The profiler's section of this layer's attention part (norm, projections, cache,
    /// attention or recurrence, output).
    fn section(&self) -> &'static str {
        match self {
            Attn::Grouped(_) => "full attention",
            Attn::Mla(_) => "MLA attention",
            Attn::Linear(_) => "linear attention",
        }
    }

    /// Records what comes before the session's cache store and attention (see
    /// [`GpuModel::record_attention`]).
    fn record_inputs(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        match self {
            Attn::Grouped(a) => a.record_inputs(gpu, pass, n),
            Attn::Mla(a) => a.record_inputs(gpu, pass, n),
            Attn::Linear(a) => a.record_inputs(gpu, pass, n),
        }
    }

    /// Records what depends on the step's positions before the cache store (MLA's RoPE; the
    /// grouped layers' RoPE is part of their cache store).
    fn record_positional(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        if let Attn::Mla(a) = self {
            a.record_positional(gpu, pass, n);
        }
    }

    /// Records what follows the attention (output gate, gated norm) and `o_proj`, adding the
    /// attention output into the residual.
    fn record_output(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        match self {
            Attn::Grouped(a) => {
                if let Some(g) = &a.out_gate {
                    g.record_gating(gpu, pass, n);
                }
                a.o.record(gpu, pass, n)
            }
            Attn::Mla(a) => a.record_output(gpu, pass, n),
            Attn::Linear(a) => a.record_output(gpu, pass, n),
        }
    }
}

impl Mlp {
    fn record(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        self.gate_up.record(gpu, pass, n);
        self.swiglu.record(gpu, pass, n);
        self.down.record(gpu, pass, n);
    }
}
