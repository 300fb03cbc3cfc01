//! The embeddable engine: load a model directory (this file) and generate or score on it
//! (`generation`); its options are in [`super::options`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::constraint::Grammars;
use super::heap_trim::{self, TrimOnDrop};
use super::memory_plan::{self, kv_memory_left, plan_kv, KvPlan};
use super::sampler::SamplingParams;
use super::sampling_defaults::{self, SamplingOverrides};
use super::session::Session;
use super::tokenizer::Tokenizer;
use crate::convert::{
    cached_conversion, default_cache_root, is_converted, ConvertOptions, ModelManifest, EXPERTS_FILE,
};
use crate::decoder::{DecoderOptions, GpuModel, LayerObserver, RoutingMode, StreamingOptions};
use crate::error::{Error, Result};
use crate::experts::arena::SlotLayout;
use crate::experts::residency::ExpertStats;
use crate::experts::source::{CheckpointExperts, ExpertSource, StoreExperts};
use crate::experts::tiled_source::TiledExperts;
use crate::gpu::Gpu;
use crate::model::gguf::GgufModel;
use crate::model::lora::LoraAdapter;
use crate::model::{ArchSpec, AttentionKind, CacheShape, Checkpoint};
use crate::ops::{KvDtype, WeightFormat};
use crate::store::{ExpertStore, IoMode, OpenOptions as StoreOpenOptions};

mod attach;
mod draft_prefetch;
mod generation;
mod mtp_drafts;
mod scheduler;
mod scoring;

pub use super::options::{EngineOptions, ExpertBudget, GenerateOptions, MtpLoad, DEFAULT_IO_THREADS};
pub use generation::{Generation, DRAFTS_WITH_A_CONSTRAINT, DRAFTS_WITH_PREDICTED_ROUTING};
pub use scheduler::{Finished, OnToken, RequestId, Scheduler};
pub use scoring::Score;

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
    /// Whether greedy decode chains its steps where the model allows
    /// ([`GpuModel::submit_chained`]): by default on hardware adapters, not on software ones;
    /// `MOESTREAM_CHAINED_DECODE=on|off` decides instead.
    chained_decode: AtomicBool,
    /// Whether drafting pauses when it costs more time than it saves ([`Engine::set_draft_payoff`];
    /// `MOESTREAM_DRAFT_PAYOFF`).
    draft_payoff: AtomicBool,
    /// Whether a verify step's experts are read before it from the routing its tokens had where
    /// they stood before ([`Engine::set_draft_prefetch`]): by default on hardware adapters, not
    /// on software ones; `MOESTREAM_DRAFT_PREFETCH=on|off` decides instead.
    draft_prefetch: AtomicBool,
    /// What the CLI, `serve` and the C API sample with where the caller names nothing.
    sampling_defaults: SamplingParams,
    /// The constraint compiler, built at the first constrained request (its error kept).
    grammars: OnceLock<std::result::Result<Arc<Grammars>, String>>,
    /// Last, so that it runs after the model (and its GPU context, when this engine held the
    /// last reference) has been freed.
    _trim: TrimOnDrop,
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
                "expert budget: {slots} of {total} slots ({} MiB) from {} MiB free on the adapter ({:?}) less {} MiB for weights, KV cache, activations and (software adapters) host-side staging",
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

/// What a model directory holds, resolved and checked before anything goes to the GPU.
struct OnDisk {
    /// The model directory (a converted one, or the cache entry a conversion made).
    dir: PathBuf,
    /// Whether it is a converted directory (its weights are stored as they run).
    converted: bool,
    spec: ArchSpec,
    expert_format: WeightFormat,
    dense_format: WeightFormat,
    lora: Option<LoraAdapter>,
    /// The GGUF file's tokenizer (others are read from `tokenizer.json` later).
    tokenizer: Option<Tokenizer>,
    ckpt: Arc<Checkpoint>,
    /// Where routed experts are read from (in the CPU layout's tiles where kernels read them so).
    source: Option<Arc<dyn ExpertSource>>,
    /// The sampling the model recommends, over llama.cpp's defaults.
    sampling: SamplingParams,
    /// `spec` with the MTP module's layer appended, when it is loaded.
    mtp_spec: Option<ArchSpec>,
}

impl OnDisk {
    /// Resolves `options`' model directory and reads its manifest, config, checkpoint, LoRA
    /// and expert store, checking each against the others.
    fn read(
        gpu: &Arc<Gpu>,
        options: &EngineOptions,
        wrap: &dyn Fn(Arc<dyn ExpertSource>) -> Arc<dyn ExpertSource>,
    ) -> Result<OnDisk> {
        let dir = resolve_model_dir(options)?;
        let dir = &dir;
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
        let sampling = match (&gguf, converted.as_ref().and_then(|m| m.gguf.as_ref())) {
            (Some(g), Some(path)) => SamplingOverrides::from_gguf(g).model_defaults(&path.display().to_string()),
            _ => sampling_defaults::from_model_dir(dir),
        };
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
        let expert_format = match converted.is_none() && crate::model::gpt_oss_weights::experts_are_mxfp4(&ckpt, &spec)
        {
            true => WeightFormat::of_ggml(crate::quant::GgmlType::Mxfp4).for_gpu(),
            false => expert_format,
        };
        let mut mtp_spec = mtp_drafts::mtp_to_load(options.mtp, || crate::model::mtp::available(&ckpt, &spec))?;
        let source: Option<Arc<dyn ExpertSource>> = match (&spec.moe, &converted) {
            (None, _) => None,
            (Some(m), Some(manifest)) => {
                let path = dir.join(manifest.experts.file.as_deref().unwrap_or(EXPERTS_FILE));
                let store_bytes = std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len();
                let (direct_io, why) = options.direct_io.resolve(store_bytes);
                let store =
                    ExpertStore::open_with(&path, spec.hash(), StoreOpenOptions { direct_io, ..Default::default() })?;
                if let Some(l) = mtp_spec.as_ref().map(|_| spec.layers as u32).filter(|l| !store.layers().contains(l)) {
                    let why = format!("--speculative mtp: {} was converted without its MTP layer ({l})", dir.display());
                    mtp_spec = mtp_drafts::mtp_to_load(options.mtp, || {
                        Err(Error::UnsupportedConfig(why + "; convert it again"))
                    })?;
                }
                match (direct_io, store.io_mode(), store.direct_io_error()) {
                    (false, _, _) => log::info!("expert store: buffered reads ({why})"),
                    (true, IoMode::Direct, _) => log::info!("expert store: uncached reads (O_DIRECT) ({why})"),
                    (true, _, reason) => log::warn!(
                        "expert store: uncached reads wanted ({why}) but refused, reading buffered: {}",
                        reason.unwrap_or("unknown")
                    ),
                }
                Some(Arc::new(StoreExperts::new(store, spec.hidden, m.expert_intermediate)?) as Arc<dyn ExpertSource>)
            }
            (Some(m), None) => {
                let layout = SlotLayout::new(expert_format, spec.hidden, m.expert_intermediate)?;
                // The MTP module's experts are one more layer's.
                let spec = mtp_spec.as_ref().unwrap_or(&spec).clone();
                Some(Arc::new(CheckpointExperts::new(ckpt.clone(), spec, layout)) as Arc<dyn ExpertSource>)
            }
        };
        // Slots in the CPU layout's tiles where the kernels read them so.
        let source = source.map(|s| TiledExperts::over(gpu, wrap(s)));
        Ok(OnDisk {
            dir: dir.clone(),
            converted: converted.is_some(),
            spec,
            expert_format,
            dense_format,
            lora,
            tokenizer,
            ckpt,
            source,
            sampling,
            mtp_spec,
        })
    }

    /// The decoder's options and the KV plan: the expert budget (slots when streaming) and the
    /// KV memory, from what the adapter has free.
    fn plan(&self, gpu: &Arc<Gpu>, options: &EngineOptions) -> Result<(DecoderOptions, KvPlan)> {
        let OnDisk { spec, ckpt, source, converted, expert_format, dense_format, mtp_spec, .. } = self;
        // The MTP module's layer counts in the caches and the expert budget like any other.
        let (spec, expert_format, dense_format) = (mtp_spec.as_ref().unwrap_or(spec), *expert_format, *dense_format);
        // The automatic expert budget leaves room for `parallel` sequences of the requested
        // context (by default the model's maximum up to 4096); the KV budget is what is left
        // after experts.
        let budget_context = options.context.unwrap_or(spec.max_positions.min(4096));
        let activations = memory_plan::activation_bytes(spec, options.max_batch);
        let weights = memory_plan::resident_weight_bytes(ckpt, dense_format, *converted);
        let host_side =
            source.as_ref().map_or(0, |s| memory_plan::host_side_bytes(gpu, options.io_threads, s.read_len()));
        let sequences = options.parallel.max(1) as u64;
        // A model that may stream experts keeps copies of its linear-attention states for
        // optimistic steps (whether it streams is decided below, from what is left).
        let shape = |context| CacheShape {
            context,
            max_step: options.max_batch,
            rings: options.window_rings,
            state_copy: source.is_some(),
        };
        let caches = sequences * spec.kv_cache_bytes(shape(budget_context), options.kv_dtype);
        let resident_bytes = weights + caches + activations + host_side;
        let streaming = source
            .as_ref()
            .map(|s| budget_slots(spec, s.layout().slot_bytes, options, gpu, resident_bytes))
            .transpose()?
            .flatten();
        let expert_bytes = match (&spec.moe, &source) {
            (Some(m), Some(s)) => {
                let total = spec.moe_layers.iter().filter(|x| **x).count() * m.num_experts;
                (streaming.unwrap_or(total) * s.layout().slot_bytes) as u64
            }
            _ => 0,
        };
        let fixed = weights + activations + expert_bytes + host_side;
        let kv_memory = options.kv_memory.unwrap_or_else(|| kv_memory_left(memory_plan::free_bytes(gpu), fixed));
        let kv = plan_kv(spec, options.kv_dtype, options.context, (kv_memory, sequences), shape(spec.max_positions))?;
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
            window_rings: options.window_rings,
            state_snapshots: options.state_snapshots,
            mtp: mtp_spec.is_some(),
            streaming: streaming.map(|slots| StreamingOptions {
                slots,
                policy: options.policy,
                prefetch: options.prefetch,
                io_threads: options.io_threads,
                eamc_capacity: options.eamc_capacity,
            }),
        };
        Ok((decoder, kv))
    }
}

impl Engine {
    /// Loads the model described by `options`. Where a kernel fails to build on a DX12
    /// adapter (a shader compiler's error), loads again on a Vulkan adapter with a warning
    /// ([`Gpu::fallback_for`]).
    pub fn load(options: &EngineOptions) -> Result<Engine> {
        let gpu = Gpu::new(&options.gpu)?;
        let error = match Self::load_on(gpu.clone(), options) {
            Err(error) => error,
            loaded => return loaded,
        };
        let Some(gpu_options) = gpu.fallback_for(&error, &options.gpu) else { return Err(error) };
        log::warn!("{}: {error}; falling back to Vulkan", gpu.adapter.name);
        drop(gpu);
        Self::load_on(Gpu::new(&gpu_options)?, &EngineOptions { gpu: gpu_options, ..options.clone() })
    }

    /// Loads onto an already opened GPU context (several engines can share one).
    pub fn load_on(gpu: Arc<Gpu>, options: &EngineOptions) -> Result<Engine> {
        Self::load_with_experts(gpu, options, &|source| source)
    }

    /// Like [`Engine::load_on`], with `wrap` interposed on the expert source (tests inject
    /// read delays and failures this way). Three steps: what is on disk (`OnDisk::read`), the
    /// memory plan (`OnDisk::plan`), the model built on the GPU with what it attaches.
    pub fn load_with_experts(
        gpu: Arc<Gpu>,
        options: &EngineOptions,
        wrap: &dyn Fn(Arc<dyn ExpertSource>) -> Arc<dyn ExpertSource>,
    ) -> Result<Engine> {
        heap_trim::keep_large_blocks_mapped();
        let disk = OnDisk::read(&gpu, options, wrap)?;
        let (decoder, kv) = disk.plan(&gpu, options)?;
        let OnDisk { dir, spec, ckpt, source, lora, mut tokenizer, sampling, mtp_spec, .. } = disk;
        let mut model =
            gpu.clone().catch_out_of_memory(|| GpuModel::load(gpu, &spec, &ckpt, source, decoder, lora.as_ref()))?;
        // A trace names every layer whose experts go through the slots: the MTP module's too.
        attach::attach_to_model(&mut model, mtp_spec.as_ref().unwrap_or(&spec), &dir, options)?;
        let dir = &dir;
        if tokenizer.is_none() && dir.join("tokenizer.json").exists() {
            tokenizer = Some(Tokenizer::from_dir(dir)?);
        }
        // On a software adapter the host thread and the "GPU" share the cores, and running a
        // step ahead measured slower there (benches/README, "Chained greedy decode").
        let chained_decode =
            crate::env_choice::env_choice("MOESTREAM_CHAINED_DECODE", &[("on", true), ("off", false)])?
                .unwrap_or(!model.gpu().adapter.software);
        let on_off = |name| crate::env_choice::env_choice(name, &[("on", true), ("off", false)]);
        let draft_payoff = on_off("MOESTREAM_DRAFT_PAYOFF")?.unwrap_or(true);
        // Reads ahead share a software adapter's cores with its kernels: slower there
        // (benches/README, "Reading a verify step's experts ahead").
        let draft_prefetch = on_off("MOESTREAM_DRAFT_PREFETCH")?.unwrap_or(!model.gpu().adapter.software);
        Ok(Engine {
            model,
            tokenizer,
            dir: dir.clone(),
            eamc_file: options.eamc_file.clone(),
            routing: options.routing,
            kv,
            default_session: Mutex::new(None),
            chained_decode: AtomicBool::new(chained_decode),
            draft_payoff: AtomicBool::new(draft_payoff),
            draft_prefetch: AtomicBool::new(draft_prefetch),
            sampling_defaults: sampling,
            grammars: OnceLock::new(),
            _trim: TrimOnDrop,
        })
    }

    /// The architecture.
    pub fn spec(&self) -> &ArchSpec {
        self.model.spec()
    }

    /// How decode steps route ([`RoutingMode::Predicted`]: the prerouter's prediction).
    pub fn routing(&self) -> RoutingMode {
        self.routing
    }

    /// The model directory.
    pub fn model_dir(&self) -> &Path {
        &self.dir
    }

    /// The decoder, for running steps directly (a session's cache: [`GpuModel::new_cache`]).
    pub fn model(&self) -> &GpuModel {
        &self.model
    }

    /// The GPU context.
    pub fn gpu(&self) -> &Arc<Gpu> {
        self.model.gpu()
    }

    /// Whether greedy decode chains its steps (on, and possible for this model:
    /// [`GpuModel::can_chain`]).
    pub fn chains_decode(&self) -> bool {
        self.chained_decode() && self.model.can_chain()
    }

    /// Whether chained greedy decode is on ([`Engine::set_chained_decode`]).
    pub fn chained_decode(&self) -> bool {
        self.chained_decode.load(Ordering::Relaxed)
    }

    /// Turns chained greedy decode on (the default on hardware adapters) or off: with it, each one-token step is
    /// submitted before the previous one's token is read, where the model allows; the tokens
    /// are the same either way.
    pub fn set_chained_decode(&self, on: bool) {
        self.chained_decode.store(on, Ordering::Relaxed);
    }

    /// Whether requests pause drafting that costs more time per token than plain steps
    /// ([`crate::runtime::drafts::DraftPacing::timed`]; on by default).
    pub fn draft_payoff(&self) -> bool {
        self.draft_payoff.load(Ordering::Relaxed)
    }

    /// Turns the time-based pause of drafting on or off: off, how many drafts a request
    /// proposes depends on what was accepted only (reproducible figures; the tokens are the
    /// same either way).
    pub fn set_draft_payoff(&self, on: bool) {
        self.draft_payoff.store(on, Ordering::Relaxed);
    }

    /// Whether drafting requests read their verify steps' experts ahead
    /// ([`Engine::set_draft_prefetch`]).
    pub fn draft_prefetch(&self) -> bool {
        self.draft_prefetch.load(Ordering::Relaxed)
    }

    /// Turns the reads ahead of verify steps on (the default on hardware adapters) or off: on,
    /// while experts stream, a drafting request remembers its sequence's routing, and before a
    /// verify step starts reading the experts its tokens routed to where they stood before
    /// (where prompt lookup copied them from, else where the same token last stood); the
    /// tokens are the same either way.
    pub fn set_draft_prefetch(&self, on: bool) {
        self.draft_prefetch.store(on, Ordering::Relaxed);
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

    /// The sampling to use where the caller names none: the model's recommendation
    /// (`generation_config.json`, or a GGUF's `general.sampling.*`) over llama.cpp's defaults
    /// ([`SamplingParams::llama_cpp`]). [`SamplingParams::default`], what the library's own
    /// options start from, stays greedy.
    pub fn sampling_defaults(&self) -> SamplingParams {
        self.sampling_defaults
    }

    /// Compiles constraints for this model (built on first use: the vocabulary's token trie).
    pub fn grammars(&self) -> Result<Arc<Grammars>> {
        let built = self.grammars.get_or_init(|| {
            let tokenizer = self.tokenizer.as_ref().ok_or("constrained decoding needs the model's tokenizer")?;
            let eos = self.spec().eos_token_ids.first().copied().unwrap_or(0);
            Grammars::new(tokenizer, self.spec().vocab, eos).map(Arc::new).map_err(|e| e.to_string())
        });
        built.clone().map_err(Error::InvalidArgument)
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
