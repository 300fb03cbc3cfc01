//! How to load a model ([`EngineOptions`], [`ExpertBudget`]) and what a generation should do
//! ([`GenerateOptions`]).

use std::path::PathBuf;

use crate::decoder::RoutingMode;
use crate::experts::eam::DEFAULT_EAMC_CAPACITY;
use crate::experts::policy::PolicyKind;
use crate::experts::predictor::PrefetchKind;
use crate::gpu::GpuOptions;
use crate::model::MlaCacheKind;
use crate::ops::{KvDtype, WeightFormat};
use crate::runtime::direct_io::DirectIo;
use crate::runtime::sampler::SamplingParams;

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
    /// Most prompt tokens per prefill step (and tokens per batched step).
    pub max_batch: usize,
    /// Sliding-window layers keep a ring of `window + max_batch - 1` positions (the default);
    /// `false` keeps every position there too (llama.cpp's `--swa-full`): more memory, but a
    /// session rolled back past the ring resumes without recomputing its prompt.
    pub window_rings: bool,
    /// Snapshots of a hybrid model's linear-attention states each sequence may keep (taken
    /// where a prompt's last chunk starts), so a rolled-back sequence resumes from the nearest
    /// one instead of position 0; each takes the states' bytes from the KV budget when first
    /// taken (llama.cpp's `--ctx-checkpoints`). 0: none.
    pub state_snapshots: usize,
    /// Sequences the memory plan makes room for (a [`crate::runtime::Scheduler`]'s slots):
    /// the automatic expert budget and the default context leave room for this many caches.
    pub parallel: usize,
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
    /// Whether the checkpoint's MTP module is loaded, for drafts
    /// ([`GenerateOptions::mtp_drafts`]).
    pub mtp: MtpLoad,
}

/// Whether an engine loads the checkpoint's multi-token-prediction module
/// ([`crate::model::mtp`]): its layer's weights, experts and KV cache cost memory like one more
/// decoder layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MtpLoad {
    /// Never.
    #[default]
    Off,
    /// Where the checkpoint has one the engine runs (else the engine loads without, saying why
    /// in the log).
    Available,
    /// Always: a model without one the engine runs is refused by name.
    Required,
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

/// Most tokens per step by default (prefill chunks, batched steps).
pub const DEFAULT_MAX_BATCH: usize = 64;

/// Snapshots of the linear-attention states per sequence by default: a regenerated answer and
/// the turn before it resume without recomputing the conversation.
pub const DEFAULT_STATE_SNAPSHOTS: usize = 2;

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
            max_batch: DEFAULT_MAX_BATCH,
            window_rings: true,
            state_snapshots: DEFAULT_STATE_SNAPSHOTS,
            parallel: 1,
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
            mtp: MtpLoad::Off,
        }
    }
}

/// What `generate` should do.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Token choice.
    pub sampling: SamplingParams,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Speculative decoding with prompt-lookup drafts, verified exactly (`None`: one token a
    /// step).
    pub drafts: Option<crate::runtime::drafts::PromptLookup>,
    /// Speculative decoding with drafts from the model's MTP module (loaded with
    /// [`EngineOptions::mtp`]), at most this many a step, verified exactly; 0: none. Takes the
    /// place of `drafts` where both are set.
    pub mtp_drafts: usize,
    /// Report each generated token's log-probability and those of this many most likely
    /// tokens (0..=20; `None`: no log-probabilities).
    pub logprobs: Option<usize>,
    /// Also report the log-probabilities of the prompt's tokens after the first (with
    /// `logprobs` alternatives each), the whole prompt computed again; only through the
    /// [`crate::runtime::Scheduler`].
    pub prompt_logprobs: bool,
    /// What the generated text must match (a JSON schema, regex or grammar); `None`: anything.
    /// Needs the logits on the CPU each token; not with drafts.
    pub constraint: Option<crate::runtime::Constraint>,
    /// Tokens besides the model's end-of-sequence ids that end the text for the caller, such as
    /// a chat template's end of turn: a constraint allows them where its grammar may end.
    pub end_tokens: Vec<u32>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 128,
            sampling: SamplingParams::default(),
            ignore_eos: false,
            drafts: None,
            mtp_drafts: 0,
            logprobs: None,
            prompt_logprobs: false,
            constraint: None,
            end_tokens: Vec::new(),
        }
    }
}
