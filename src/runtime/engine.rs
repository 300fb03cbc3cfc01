//! The embeddable engine: load a model directory, generate (streaming, cancellable), score.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

use super::direct_io::DirectIo;
use super::memory_plan::{self, kv_memory_left, plan_kv, KvPlan};
use super::sampler::{Sampler, SamplingParams};
use super::session::Session;
use super::stats::{peak_rss_bytes, Stats};
use super::tokenizer::{TextStream, Tokenizer};
use crate::convert::{
    cached_conversion, default_cache_root, is_converted, ConvertOptions, ModelManifest, EXPERTS_FILE,
};
use crate::error::{Error, Result};
use crate::experts::arena::SlotLayout;
use crate::experts::eam::DEFAULT_EAMC_CAPACITY;
use crate::experts::policy::{Phase, PolicyKind};
use crate::experts::predictor::PrefetchKind;
use crate::experts::residency::ExpertStats;
use crate::experts::source::{CheckpointExperts, ExpertSource, StoreExperts};
use crate::experts::trace::TraceHeader;
use crate::gpu::{Gpu, GpuOptions};
use crate::model::decoder::{
    DecoderOptions, GpuModel, LayerObserver, RoutingMode, StepOutput, StepResult, StreamingOptions,
};
use crate::model::gguf::GgufModel;
use crate::model::lora::LoraAdapter;
use crate::model::{ArchSpec, AttentionKind, Checkpoint, MlaCacheKind};
use crate::ops::{KvDtype, WeightFormat};
use crate::prerouter::heads_file::HEADS_FILE;
use crate::store::{ExpertStore, IoMode, OpenOptions as StoreOpenOptions};

/// How to load a model.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer.json).
    pub model_dir: PathBuf,
    /// Format of the routed experts on the GPU.
    pub experts: WeightFormat,
    /// Format of attention, dense/shared FFN and lm_head weights on the GPU.
    pub dense: WeightFormat,
    /// Positions per sequence (each session's KV cache); `None` = the model's maximum or what
    /// fits the memory left after weights and the expert budget, whichever is smaller.
    pub context: Option<usize>,
    /// Element type of the KV caches.
    pub kv_dtype: KvDtype,
    /// What MLA layers cache (DeepSeek-V2/V3): the latent (default) or every head's decompressed
    /// keys and values; other models ignore it.
    pub mla_cache: MlaCacheKind,
    /// Bytes all sessions' KV caches may take together; `None` = the memory left after
    /// weights, the expert budget and some headroom.
    pub kv_memory: Option<u64>,
    /// Most prompt tokens per prefill step.
    pub max_batch: usize,
    /// Adapter choice and overrides.
    pub gpu: GpuOptions,
    /// GPU memory for routed experts.
    pub budget: ExpertBudget,
    /// Eviction policy when streaming.
    pub policy: PolicyKind,
    /// Prefetch predictor when streaming.
    pub prefetch: PrefetchKind,
    /// Reader threads for the expert store.
    pub io_threads: usize,
    /// Capacity of the EAMC collection.
    pub eamc_capacity: usize,
    /// EAMC collection file: loaded at start if it exists, saved when the engine is dropped.
    pub eamc_file: Option<PathBuf>,
    /// Write per-step routing to this file.
    pub trace: Option<PathBuf>,
    /// Trained prerouter heads (safetensors), run after each token when streaming with a
    /// prefetcher that reads them or with [`RoutingMode::Predicted`]; `None` uses the model
    /// directory's `prerouter.safetensors` when it has one.
    pub prerouter: Option<PathBuf>,
    /// Native routing, or the prerouter's prediction as the routing of decode steps.
    pub routing: RoutingMode,
    /// Read the expert store with O_DIRECT: on, off, or when it exceeds the memory available.
    pub direct_io: DirectIo,
    /// A PEFT LoRA adapter directory (`adapter_config.json`, `adapter_model.safetensors`),
    /// applied unmerged on top of the weights in whatever format they run.
    pub lora: Option<PathBuf>,
    /// Where Hugging Face directories run in int4 are converted (once); `None` means
    /// [`crate::convert::default_cache_root`].
    pub cache_dir: Option<PathBuf>,
}

/// How much GPU memory routed experts may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertBudget {
    /// Every expert resident when they fit in available memory, else the largest budget that does.
    Auto,
    /// This many expert slots.
    Slots(usize),
    /// This many bytes of expert slots.
    Bytes(u64),
}

/// Reader threads by default: NVMe drives want several requests in flight.
pub const DEFAULT_IO_THREADS: usize = 4;

impl EngineOptions {
    /// Uses `format` for every weight.
    pub fn with_format(mut self, format: WeightFormat) -> Self {
        self.experts = format;
        self.dense = format;
        self
    }

    /// Defaults for `model_dir`: f16 weights, f16 KV cache, the largest context that fits,
    /// prefill chunks of 64.
    pub fn new(model_dir: impl Into<PathBuf>) -> Self {
        EngineOptions {
            model_dir: model_dir.into(),
            experts: WeightFormat::F16,
            dense: WeightFormat::F16,
            context: None,
            kv_dtype: KvDtype::F16,
            mla_cache: MlaCacheKind::Latent,
            kv_memory: None,
            max_batch: 64,
            gpu: GpuOptions::default(),
            budget: ExpertBudget::Auto,
            policy: PolicyKind::Eamc,
            prefetch: PrefetchKind::Eamc,
            io_threads: DEFAULT_IO_THREADS,
            eamc_capacity: DEFAULT_EAMC_CAPACITY,
            eamc_file: None,
            trace: None,
            prerouter: None,
            routing: RoutingMode::Native,
            direct_io: DirectIo::Auto,
            lora: None,
            cache_dir: None,
        }
    }
}

/// What `generate` should do.
#[derive(Clone, Copy, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Token choice.
    pub sampling: SamplingParams,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions { max_tokens: 128, sampling: SamplingParams::default(), ignore_eos: false }
    }
}

/// A finished generation.
#[derive(Clone, Debug, Serialize)]
pub struct Generation {
    /// The prompt's token ids.
    pub prompt_tokens: Vec<u32>,
    /// The generated ids.
    pub tokens: Vec<u32>,
    /// The generated text (empty without a tokenizer).
    pub text: String,
    /// Speed and memory.
    pub stats: Stats,
}

/// Teacher-forced scores of a sequence.
#[derive(Clone, Debug, Serialize)]
pub struct Score {
    /// The sequence.
    pub tokens: Vec<u32>,
    /// `log p(tokens[i+1] | tokens[..=i])`, n-1 values.
    pub logprobs: Vec<f32>,
    /// `exp(-mean(logprobs))`.
    pub perplexity: f64,
    /// Expert-cache figures of the scoring pass.
    pub experts: ExpertStats,
}

/// A loaded model ready to generate and score.
pub struct Engine {
    model: GpuModel,
    tokenizer: Option<Tokenizer>,
    dir: PathBuf,
    eamc_file: Option<PathBuf>,
    routing: RoutingMode,
    kv: KvPlan,
    /// The sequence behind [`Engine::generate`], [`Engine::score`] and
    /// [`Engine::next_logprobs`] (made on first use, restarted by each call).
    default_session: Mutex<Option<Session>>,
}

/// The directory to load: a converted model as is; a GGUF file converted once into the cache
/// (its experts stored as it holds them, one extent each); a Hugging Face directory as is in
/// f32/f16, or converted once into the cache when int4 is asked for.
fn resolve_model_dir(options: &EngineOptions) -> Result<PathBuf> {
    let dir = &options.model_dir;
    let root = || options.cache_dir.clone().unwrap_or_else(default_cache_root);
    if crate::model::gguf::arch::is_gguf(dir) {
        // GGUF weights are read as stored; the format options do not apply.
        return cached_conversion(dir, &root(), &ConvertOptions::default(), &mut |_| {});
    }
    if crate::model::mlx::params(dir)?.is_some() {
        // MLX weights are read as stored; the format options do not apply.
        return Ok(dir.clone());
    }
    let wants_int4 = matches!(options.experts, WeightFormat::Int4(_)) || matches!(options.dense, WeightFormat::Int4(_));
    if is_converted(dir) || !wants_int4 {
        return Ok(dir.clone());
    }
    let root = root();
    let convert = ConvertOptions { experts: options.experts, dense: options.dense, threads: 0 };
    log::warn!("using an int4 conversion of {} cached under {}", dir.display(), root.display());
    cached_conversion(dir, &root, &convert, &mut |_| {})
}

/// The slot budget `options` asks for, `None` when every expert stays resident. `Auto` takes
/// what the adapter has free after `resident_bytes` (see [`memory_plan::auto_expert_bytes`]).
fn budget_slots(
    spec: &ArchSpec,
    slot_bytes: usize,
    options: &EngineOptions,
    gpu: &Gpu,
    resident_bytes: u64,
) -> Result<Option<usize>> {
    let m = spec.moe.as_ref().expect("only MoE models have experts");
    let total = spec.moe_layers.iter().filter(|x| **x).count() * m.num_experts;
    let slots = match options.budget {
        ExpertBudget::Slots(n) => n,
        ExpertBudget::Bytes(b) => (b / slot_bytes as u64) as usize,
        ExpertBudget::Auto => {
            let bytes = memory_plan::auto_expert_bytes(gpu, resident_bytes);
            let slots = (bytes / slot_bytes as u64).min(total as u64) as usize;
            let memory = gpu.memory();
            log::info!(
                "expert budget: {slots} of {total} slots ({} MiB) from {} MiB free on the adapter ({:?}) less {} MiB for weights, KV cache and activations",
                (slots * slot_bytes) >> 20,
                memory.available >> 20,
                memory.source,
                resident_bytes >> 20
            );
            if slots < m.top_k {
                return Err(Error::InvalidArgument(format!(
                    "the adapter has {} MiB free, the model needs {} MiB besides its experts, leaving room for {slots} expert slots of {slot_bytes} bytes; one layer's top-k needs {} (pass a smaller --context, or --gpu-memory / --expert-slots to override)",
                    memory.available >> 20,
                    resident_bytes >> 20,
                    m.top_k
                )));
            }
            slots
        }
    };
    if slots < m.top_k {
        return Err(Error::InvalidArgument(format!(
            "an expert budget of {slots} slots ({} bytes each) is below one layer's top-k ({}); the minimum is {} slots",
            slot_bytes, m.top_k, m.top_k
        )));
    }
    Ok((slots < total).then_some(slots))
}

impl Engine {
    /// Loads the model described by `options`.
    pub fn load(options: &EngineOptions) -> Result<Engine> {
        let gpu = Gpu::new(&options.gpu)?;
        Self::load_on(gpu, options)
    }

    /// Loads onto an already opened GPU context (several engines can share one).
    pub fn load_on(gpu: Arc<Gpu>, options: &EngineOptions) -> Result<Engine> {
        Self::load_with_experts(gpu, options, &|source| source)
    }

    /// Like [`Engine::load_on`], with `wrap` interposed on the expert source (tests inject
    /// read delays and failures this way).
    pub fn load_with_experts(
        gpu: Arc<Gpu>,
        options: &EngineOptions,
        wrap: &dyn Fn(Arc<dyn ExpertSource>) -> Arc<dyn ExpertSource>,
    ) -> Result<Engine> {
        let dir = &resolve_model_dir(options)?;
        let converted = match is_converted(dir) {
            true => Some(ModelManifest::load(dir)?),
            false => None,
        };
        // A converted GGUF model reads its other tensors and tokenizer from the GGUF file,
        // which must still be the one converted.
        let gguf = match converted.as_ref().and_then(|m| m.gguf.as_ref().map(|g| (m, g))) {
            Some((m, path)) => {
                if crate::convert::source_fingerprint(path)? != m.source.fingerprint {
                    return Err(Error::InvalidArgument(format!(
                        "{} changed since {} was converted from it; convert it again",
                        path.display(),
                        dir.display()
                    )));
                }
                Some(GgufModel::open(path)?)
            }
            None => None,
        };
        let mut spec = match &converted {
            Some(m) => {
                m.verify_files(dir, false)?;
                m.arch.clone()
            }
            None => ArchSpec::from_dir(dir)?,
        };
        if let AttentionKind::Mla(m) = &mut spec.attention {
            m.cache = options.mla_cache;
        }
        let (expert_format, dense_format) = match &converted {
            Some(m) => (m.expert_format(), m.dense_format()),
            None => match crate::model::mlx::params(dir)? {
                Some(p) => (WeightFormat::Int4(p), WeightFormat::Int4(p)),
                None => (options.experts, options.dense),
            },
        };
        let lora = options.lora.as_deref().map(|d| LoraAdapter::load(d, &spec)).transpose()?;
        let mut tokenizer = None;
        let ckpt = Arc::new(match gguf {
            Some(g) => {
                tokenizer = Some(Tokenizer::from_gguf(&g)?);
                Checkpoint::from_gguf(g, &spec)?
            }
            None => Checkpoint::open(dir)?,
        });
        spec.check_against(&ckpt)?;
        memory_plan::check_context(&spec, options.context)?;
        // gpt-oss's MXFP4 experts are read as stored, whatever the options say.
        let first_moe = (0..spec.layers).find(|&i| spec.is_moe_layer(i));
        let expert_format = match first_moe {
            Some(i) if converted.is_none() && crate::model::gpt_oss_weights::is_mxfp4(&ckpt, i) => {
                WeightFormat::of_ggml(crate::model::gguf::GgmlType::Mxfp4)
            }
            _ => expert_format,
        };
        let source: Option<Arc<dyn ExpertSource>> = match (&spec.moe, &converted) {
            (None, _) => None,
            (Some(m), Some(manifest)) => {
                let path = dir.join(manifest.experts.file.as_deref().unwrap_or(EXPERTS_FILE));
                let store_bytes = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len();
                let (direct_io, why) = options.direct_io.resolve(store_bytes);
                let store =
                    ExpertStore::open_with(&path, spec.hash(), StoreOpenOptions { direct_io, ..Default::default() })?;
                match (direct_io, store.io_mode(), store.direct_io_error()) {
                    (false, _, _) => log::info!("expert store: buffered reads ({why})"),
                    (true, IoMode::Direct, _) => log::info!("expert store: uncached reads (O_DIRECT) ({why})"),
                    (true, _, reason) => log::warn!(
                        "expert store: uncached reads wanted ({why}) but refused, reading buffered: {}",
                        reason.unwrap_or("unknown")
                    ),
                }
                Some(wrap(Arc::new(StoreExperts::new(store, spec.hidden, m.expert_intermediate)?)))
            }
            (Some(m), None) => {
                let layout = SlotLayout::new(expert_format, spec.hidden, m.expert_intermediate)?;
                Some(wrap(Arc::new(CheckpointExperts::new(ckpt.clone(), spec.clone(), layout))))
            }
        };
        // The automatic expert budget leaves room for one sequence of the requested context (by
        // default the model's maximum up to 4096); the KV budget is what is left after experts.
        let budget_context = options.context.unwrap_or(spec.max_positions.min(4096));
        let activations = memory_plan::activation_bytes(&spec, options.max_batch);
        let weights = memory_plan::resident_weight_bytes(&ckpt, dense_format, converted.is_some());
        let resident_bytes =
            weights + memory_plan::kv_cache_bytes(&spec, budget_context, options.kv_dtype) + activations;
        let streaming = source
            .as_ref()
            .map(|s| budget_slots(&spec, s.layout().slot_bytes, options, &gpu, resident_bytes))
            .transpose()?
            .flatten();
        let expert_bytes = match (&spec.moe, &source) {
            (Some(m), Some(s)) => {
                let total = spec.moe_layers.iter().filter(|x| **x).count() * m.num_experts;
                (streaming.unwrap_or(total) * s.layout().slot_bytes) as u64
            }
            _ => 0,
        };
        let fixed = weights + activations + expert_bytes;
        let kv_memory = options.kv_memory.unwrap_or_else(|| kv_memory_left(memory_plan::free_bytes(&gpu), fixed));
        let kv = plan_kv(&spec, options.kv_dtype, options.context, kv_memory)?;
        log::info!(
            "KV cache: {} bytes per token ({}), context {} ({} bytes per session, {} bytes for all sessions)",
            kv.bytes_per_token,
            options.kv_dtype.name(),
            kv.context,
            kv.bytes_per_token * kv.context as u64,
            kv.budget
        );
        let decoder = DecoderOptions {
            experts: expert_format,
            dense: dense_format,
            context: kv.context,
            kv_dtype: options.kv_dtype,
            kv_budget: kv.budget,
            max_batch: options.max_batch,
            streaming: streaming.map(|slots| StreamingOptions {
                slots,
                policy: options.policy,
                prefetch: options.prefetch,
                io_threads: options.io_threads,
                eamc_capacity: options.eamc_capacity,
            }),
        };
        let mut model =
            gpu.clone().catch_out_of_memory(|| GpuModel::load(gpu, &spec, &ckpt, source, decoder, lora.as_ref()))?;
        if let Some(mut r) = model.residency() {
            if let (Some(path), Some(cache)) = (&options.eamc_file, r.cache_mut()) {
                if path.exists() {
                    cache
                        .tracker_mut()
                        .load(path)
                        .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))?;
                }
            }
            if let Some(path) = &options.trace {
                let m = spec.moe.as_ref().expect("residency implies MoE");
                let moe_layers = (0..spec.layers).filter(|&i| spec.is_moe_layer(i)).map(|i| i as u32).collect();
                let header =
                    TraceHeader::new(spec.layers, m.num_experts, m.top_k, moe_layers, r.arena.layout.slot_bytes as u64);
                r.start_trace(path, &header)?;
            }
        }
        let publish = options.prefetch.uses_prerouter() && model.residency().is_some_and(|r| r.is_streaming());
        // Heads shipped with the model (`prerouter.safetensors`) serve when none are named.
        let shipped = [&options.model_dir, dir].map(|d| d.join(HEADS_FILE)).into_iter().find(|p| p.exists());
        let heads_file = options.prerouter.clone().or(shipped);
        if publish || options.routing == RoutingMode::Predicted {
            let heads = heads_file.as_deref().ok_or_else(|| {
                let what =
                    if publish { format!("prefetch `{}`", options.prefetch) } else { "predicted routing".into() };
                Error::InvalidArgument(format!("{what} needs a prerouter heads file (--prerouter FILE)"))
            })?;
            crate::prerouter::runtime::attach(&mut model, heads, options.routing, publish)?;
            if !publish && model.residency().is_some_and(|r| r.is_streaming()) {
                log::warn!(
                    "predicted routing while streaming: add --prefetch prerouter to load the predicted experts ahead"
                );
            }
        } else if options.prerouter.is_some() {
            log::warn!("prerouter heads unused: they need --routing predicted or a streaming --prefetch prerouter");
        }
        if tokenizer.is_none() && dir.join("tokenizer.json").exists() {
            tokenizer = Some(Tokenizer::from_dir(dir)?);
        }
        Ok(Engine {
            model,
            tokenizer,
            dir: dir.clone(),
            eamc_file: options.eamc_file.clone(),
            routing: options.routing,
            kv,
            default_session: Mutex::new(None),
        })
    }

    /// The architecture.
    pub fn spec(&self) -> &ArchSpec {
        self.model.spec()
    }

    /// The model directory.
    pub fn model_dir(&self) -> &Path {
        &self.dir
    }

    /// The GPU context.
    pub fn gpu(&self) -> &Arc<Gpu> {
        self.model.gpu()
    }

    /// Installs (or removes) a per-MoE-layer observer of `hn` and routed ids; see
    /// [`GpuModel::set_observer`].
    pub fn set_observer(&self, observer: Option<LayerObserver>) {
        self.model.set_observer(observer);
    }

    /// Positions per sequence (the KV-cache length of every session).
    pub fn context(&self) -> usize {
        self.model.options().context
    }

    /// The KV-cache plan: context, bytes per token, budget for all sessions.
    pub fn kv_plan(&self) -> KvPlan {
        self.kv
    }

    /// Element type of the KV caches.
    pub fn kv_dtype(&self) -> KvDtype {
        self.model.options().kv_dtype
    }

    /// A new empty session with its own KV cache, reserved from the KV budget
    /// ([`Error::KvCacheTooLarge`] when it does not fit beside the live sessions).
    pub fn new_session(&self) -> Result<Session> {
        Ok(Session::new(self.model.new_cache()?))
    }

    /// The tokenizer, when the model directory has one.
    pub fn tokenizer(&self) -> Option<&Tokenizer> {
        self.tokenizer.as_ref()
    }

    /// Token ids of `text` (errors without a tokenizer).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.require_tokenizer()?.encode(text)
    }

    /// Token ids of `text` without the tokenizer's added special tokens (a rendered chat
    /// template, or text appended to a session), erroring without a tokenizer.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        self.require_tokenizer()?.encode_raw(text)
    }

    fn require_tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| Error::Tokenizer("the model has no tokenizer.json".into()))
    }

    fn check_prompt(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.check_tokens(tokens, 0)
    }

    /// Checks that `tokens` are in the vocabulary and fit after `before` positions.
    fn check_tokens(&self, tokens: &[u32], before: usize) -> Result<()> {
        if before + tokens.len() > self.context() {
            return Err(Error::ContextOverflow { requested: before + tokens.len(), context: self.context() });
        }
        let vocab = self.spec().vocab;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(&id) => Err(Error::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }

    /// Runs `f` on the default session, emptied first.
    fn with_default_session<T>(&self, f: impl FnOnce(&mut Session) -> Result<T>) -> Result<T> {
        let mut slot = self.default_session.lock().expect("default session lock");
        if slot.is_none() {
            *slot = Some(self.new_session()?);
        }
        let session = slot.as_mut().expect("made above");
        session.truncate(0);
        f(session)
    }

    /// Brings `session`'s cache up to its whole sequence, in steps of at most `max_batch`
    /// tokens; the last step produces `last`. The last token is run again when the cache
    /// already holds everything (its output is needed).
    fn prefill(&self, session: &mut Session, last: StepOutput<'_>) -> Result<StepResult> {
        self.check_owner(session)?;
        let b = self.model.options().max_batch;
        let len = session.tokens.len();
        session.cached = session.cache.resume_point(session.cached.min(len - 1));
        let mut result = StepResult::None;
        while session.cached < len {
            let start = session.cached;
            let end = (start + b).min(len);
            let output = if end == len { last } else { StepOutput::None };
            result = self.model.step(&session.cache, &session.tokens[start..end], start, Phase::Prefill, output)?;
            session.cached = end;
        }
        Ok(result)
    }

    /// Refuses a session made by another engine (its caches are bound to that engine's model).
    fn check_owner(&self, session: &Session) -> Result<()> {
        match self.model.owns(&session.cache) {
            true => Ok(()),
            false => Err(Error::InvalidArgument("the session belongs to another engine".into())),
        }
    }

    /// Generates after `prompt`, calling `on_token(id, text_piece)` for each new token; the
    /// callback returns `false` to stop early (cancellation). Each call starts a new sequence.
    pub fn generate(
        &self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: impl FnMut(u32, &str) -> bool,
    ) -> Result<Generation> {
        self.check_prompt(prompt)?;
        self.with_default_session(|s| self.generate_in(s, prompt, options, on_token))
    }

    /// Appends `new_tokens` to `session` and generates after them, like [`Engine::generate`]:
    /// only what the session's cache does not hold yet is prefilled, and the generated tokens
    /// become part of the session (the next call appends after them).
    pub fn generate_in(
        &self,
        session: &mut Session,
        new_tokens: &[u32],
        options: &GenerateOptions,
        mut on_token: impl FnMut(u32, &str) -> bool,
    ) -> Result<Generation> {
        self.check_owner(session)?;
        if session.is_empty() && new_tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.check_tokens(new_tokens, session.len())?;
        session.tokens.extend_from_slice(new_tokens);
        let before = self.begin_request()?;
        let greedy = options.sampling.is_greedy();
        let want = if greedy { StepOutput::Argmax } else { StepOutput::Logits };
        let mut sampler = Sampler::new(options.sampling);
        let mut pick = |r: StepResult| match r {
            StepResult::Token(t) => t,
            StepResult::Logits(l) => sampler.sample(&l),
            _ => unreachable!("generate asks for a token or logits"),
        };
        let mut stream = self.tokenizer.as_ref().map(TextStream::new);
        let mut text = String::new();
        let mut tokens = Vec::new();
        let reused = session.cached.min(session.len() - 1);
        let started = Instant::now();
        let first = self.prefill(session, if options.max_tokens > 0 { want } else { StepOutput::None })?;
        let mut next = if options.max_tokens > 0 { Some(pick(first)) } else { None };
        let prefill_s = started.elapsed().as_secs_f64();
        let prefilled = session.len() - reused;
        let decode_start = Instant::now();
        let eos = &self.spec().eos_token_ids;
        while let Some(t) = next.take() {
            if !options.ignore_eos && eos.contains(&t) {
                break;
            }
            tokens.push(t);
            session.tokens.push(t);
            let piece = match stream.as_mut() {
                Some(s) => s.push(t)?,
                None => String::new(),
            };
            text.push_str(&piece);
            let pos = session.len() - 1;
            if !on_token(t, &piece) || tokens.len() >= options.max_tokens || pos + 1 > self.context() {
                break;
            }
            next = Some(pick(self.model.step(&session.cache, &[t], pos, Phase::Decode, want)?));
            session.cached = pos + 1;
        }
        let decode_s = decode_start.elapsed().as_secs_f64();
        let decode_steps = tokens.len().saturating_sub(1);
        let experts = self.end_request(before);
        Ok(Generation {
            prompt_tokens: new_tokens.to_vec(),
            tokens,
            text,
            stats: Stats {
                prefill_tokens_per_s: prefilled as f64 / prefill_s.max(1e-9),
                decode_tokens_per_s: if decode_steps > 0 { decode_steps as f64 / decode_s.max(1e-9) } else { 0.0 },
                prefilled_tokens: prefilled,
                reused_tokens: reused,
                context: self.context(),
                kv_bytes_per_token: self.kv.bytes_per_token,
                kv_dtype: self.kv_dtype().name(),
                peak_rss_bytes: peak_rss_bytes(),
                gpu_bytes: self.gpu().bytes_allocated(),
                experts,
            },
        })
    }

    /// Marks a request's start for the expert cache and trace; returns the figures so far.
    fn begin_request(&self) -> Result<ExpertStats> {
        match self.model.residency() {
            Some(mut r) => {
                r.begin_request()?;
                Ok(r.stats())
            }
            None => Ok(ExpertStats::default()),
        }
    }

    /// Marks the request's end; returns its expert figures.
    fn end_request(&self, before: ExpertStats) -> ExpertStats {
        match self.model.residency() {
            Some(mut r) => {
                r.end_request();
                r.stats().since(&before)
            }
            None => ExpertStats::default(),
        }
    }

    /// Expert slots on the GPU when streaming (`None` when every expert is resident or the
    /// model has no routed experts).
    pub fn expert_slots(&self) -> Option<usize> {
        self.model.residency().and_then(|r| r.cache().map(|c| c.capacity()))
    }

    /// Bytes of weights one decode token reads (see [`GpuModel::weight_bytes_per_token`]).
    pub fn weight_bytes_per_token(&self) -> u64 {
        self.model.weight_bytes_per_token()
    }

    /// The layout of one expert slot (formats and bytes; `None` without routed experts).
    pub fn expert_slot_layout(&self) -> Option<SlotLayout> {
        self.model.residency().map(|r| r.arena.layout)
    }

    /// Cumulative expert-cache figures of this engine.
    pub fn expert_stats(&self) -> ExpertStats {
        self.model.residency().map(|r| r.stats()).unwrap_or_default()
    }

    /// Teacher-forces `tokens` and returns the log-probability of each next token.
    pub fn score(&self, tokens: &[u32]) -> Result<Score> {
        self.check_prompt(tokens)?;
        if tokens.len() < 2 {
            return Err(Error::InvalidArgument("scoring needs at least 2 tokens".into()));
        }
        self.with_default_session(|session| self.score_in(session, tokens))
    }

    /// Appends `new_tokens` to `session` and teacher-forces them: `log p(t | all before t)` for
    /// each new token that has a token before it in the session. The positions the session's
    /// cache holds are not recomputed (but for the last one before the new tokens, whose
    /// logits score the first); the last new token's own position is left to the next call.
    pub fn score_in(&self, session: &mut Session, new_tokens: &[u32]) -> Result<Score> {
        self.check_owner(session)?;
        self.check_tokens(new_tokens, session.len())?;
        let start = session.len().saturating_sub(1);
        session.tokens.extend_from_slice(new_tokens);
        let before = self.begin_request()?;
        let scored = self.score_from(session, start);
        let experts = self.end_request(before);
        let logprobs = scored?;
        let mean = logprobs.iter().map(|&l| l as f64).sum::<f64>() / logprobs.len().max(1) as f64;
        Ok(Score { tokens: new_tokens.to_vec(), logprobs, perplexity: (-mean).exp(), experts })
    }

    /// Runs `session`'s positions `start..len-1`, returning the log-probability of each next
    /// token (after bringing the cache up to `start`).
    fn score_from(&self, session: &mut Session, start: usize) -> Result<Vec<f32>> {
        // Predicted routing applies to one-token steps only: each token's routing is the
        // prediction made after the token before.
        let b = if self.routing == RoutingMode::Predicted { 1 } else { self.model.options().max_batch };
        let len = session.len();
        let mut logprobs = Vec::with_capacity(len.saturating_sub(start + 1));
        session.cached = session.cache.resume_point(session.cached.min(start));
        while session.cached < start {
            let (from, to) = (session.cached, (session.cached + b).min(start));
            self.model.step(&session.cache, &session.tokens[from..to], from, Phase::Prefill, StepOutput::None)?;
            session.cached = to;
        }
        session.cached = start;
        for from in (start..len.saturating_sub(1)).step_by(b) {
            let to = (from + b).min(len - 1);
            let targets = &session.tokens[from + 1..to + 1];
            let output = StepOutput::LogProbs(targets);
            match self.model.step(&session.cache, &session.tokens[from..to], from, Phase::Prefill, output)? {
                StepResult::LogProbs(lp) => logprobs.extend(lp),
                _ => unreachable!("scoring asks for log-probs"),
            }
            session.cached = to;
        }
        Ok(logprobs)
    }

    /// Appends `new_tokens` to `session` and returns the log-softmax of the logits after its
    /// whole sequence (the distribution of the next token), prefilling only what its cache does
    /// not hold.
    pub fn next_logprobs_in(&self, session: &mut Session, new_tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_owner(session)?;
        if session.is_empty() && new_tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.check_tokens(new_tokens, session.len())?;
        session.tokens.extend_from_slice(new_tokens);
        let before = self.begin_request()?;
        let result = self.prefill(session, StepOutput::Logits);
        self.end_request(before);
        match result? {
            StepResult::Logits(l) => Ok(log_softmax(&l)),
            _ => unreachable!("asked for logits"),
        }
    }

    /// Log-softmax of the logits after `tokens` (the distribution of the next token).
    pub fn next_logprobs(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_prompt(tokens)?;
        self.with_default_session(|session| self.next_logprobs_in(session, tokens))
    }
}

/// `l - logsumexp(l)`.
fn log_softmax(l: &[f32]) -> Vec<f32> {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + l.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
    l.iter().map(|v| v - lse).collect()
}

impl Drop for Engine {
    /// Saves the EAMC collection (`--eamc FILE`) and flushes the trace.
    fn drop(&mut self) {
        if let Some(mut r) = self.model.residency() {
            if let Err(e) = r.finish_trace() {
                log::error!("{e}");
            }
            if let (Some(path), Some(cache)) = (&self.eamc_file, r.cache()) {
                if let Err(e) = cache.tracker().save(path) {
                    log::error!("saving the EAMC collection to {}: {e}", path.display());
                }
            }
        }
    }
}
