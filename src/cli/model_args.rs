//! Flags shared by the subcommands that load a model.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use moestream::decoder::RoutingMode;
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::gpu::GpuOptions;
use moestream::model::MlaCacheKind;
use moestream::ops::{KvDtype, WeightFormat};
use moestream::quant::QuantParams;
use moestream::runtime::direct_io::DirectIo;
use moestream::runtime::sampling_defaults::fresh_seed;
use moestream::runtime::{EngineOptions, ExpertBudget, MtpLoad, SamplingOverrides, SamplingParams};
use moestream::runtime::{DRAFTS_WITH_A_CONSTRAINT, DRAFTS_WITH_PREDICTED_ROUTING};
use moestream::{Engine, Error, Result};

/// Weight precision on the GPU.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Dtype {
    /// 32-bit floats: exact comparison with the reference.
    F32,
    /// 16-bit floats (default for Hugging Face directories).
    F16,
    /// 4-bit groups (affine, group 32): the default for converted models.
    Int4,
}

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum KvDtypeArg {
    /// Half precision: half the memory and the bytes read per decode step (default).
    F16,
    /// Single precision: bit-comparable with the f32 reference.
    F32,
    /// 8-bit blocks of 32 with an f16 scale (llama.cpp's q8_0): about half f16's memory.
    #[value(name = "q8_0")]
    Q8_0,
    /// 4-bit blocks of 32 with an f16 scale (llama.cpp's q4_0): about 0.28× f16's memory, with
    /// a visible loss.
    #[value(name = "q4_0")]
    Q4_0,
}

impl KvDtypeArg {
    /// The engine's KV element type.
    pub fn dtype(self) -> KvDtype {
        match self {
            KvDtypeArg::F16 => KvDtype::F16,
            KvDtypeArg::F32 => KvDtype::F32,
            KvDtypeArg::Q8_0 => KvDtype::Q8_0,
            KvDtypeArg::Q4_0 => KvDtype::Q4_0,
        }
    }
}

/// What MLA layers cache.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum MlaCacheArg {
    /// The latent and the shared rotary key; absorbed attention (default).
    Latent,
    /// Every head's keys and values, as transformers caches them.
    Decompressed,
}

/// Expert eviction policy.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Policy {
    /// Least recently used.
    Lru,
    /// Least frequently used.
    Lfu,
    /// MoE-Infinity's activation-matrix priority.
    Eamc,
    /// S3-FIFO: small, main and ghost FIFO queues.
    S3fifo,
    /// ARC: adaptive recency and frequency lists.
    Arc,
}

/// Uncached (O_DIRECT) reads of the expert store.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DirectIoArg {
    /// When the store exceeds the memory available (host or cgroup limit).
    Auto,
    /// Always (buffered where the filesystem refuses, said in the log).
    On,
    /// Never.
    Off,
}

impl DirectIoArg {
    /// The engine's setting.
    pub fn mode(self) -> DirectIo {
        match self {
            DirectIoArg::Auto => DirectIo::Auto,
            DirectIoArg::On => DirectIo::On,
            DirectIoArg::Off => DirectIo::Off,
        }
    }
}

/// Expert prefetcher.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Prefetch {
    /// Load on demand only.
    None,
    /// Prefetch what the EAM collection predicts for the next layers.
    Eamc,
    /// Prefetch what the prerouter heads (`--prerouter FILE`) predicted one token ahead.
    Prerouter,
    /// Both: the prerouter's prediction first, then EAMC's guesses.
    #[value(name = "prerouter+eamc")]
    PrerouterEamc,
}

/// Where a MoE layer's experts come from.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Routing {
    /// The model's router (exact).
    Native,
    /// The prerouter's one-token-ahead prediction, for layers with a head (Edge0's
    /// prediction-as-routing; heads from `--prerouter FILE` or the model's
    /// `prerouter.safetensors`).
    Predicted,
}

impl Routing {
    /// The engine's routing mode.
    pub fn mode(self) -> RoutingMode {
        match self {
            Routing::Native => RoutingMode::Native,
            Routing::Predicted => RoutingMode::Predicted,
        }
    }
}

/// Where the model is and how to run it.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// Model directory (Hugging Face layout) or GGUF file (`.gguf`, or any part of a split set); defaults to the bundled model.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Weight precision on the GPU for Hugging Face directories (int4 converts once into the
    /// cache); converted models run in the format they were converted to.
    #[arg(long, value_enum, default_value = "f16")]
    pub dtype: Dtype,
    /// Where int4 conversions of Hugging Face directories are cached (default
    /// `$MOESTREAM_CACHE`, `$XDG_CACHE_HOME/moestream` or `~/.cache/moestream`).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Positions per sequence (KV-cache length; default: the model's maximum or what fits the
    /// memory left after weights and experts, whichever is smaller).
    #[arg(short, long)]
    pub context: Option<usize>,
    /// Element type of the KV cache.
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_dtype: KvDtypeArg,
    /// What MLA layers (DeepSeek-V2/V3) cache per position: the latent, or every head's
    /// decompressed keys and values (more memory; for comparison).
    #[arg(long, value_enum, default_value = "latent")]
    pub mla_cache: MlaCacheArg,
    /// Keep every position in sliding-window layers (gpt-oss) instead of a ring of the window:
    /// more memory, but rolling a session back past the ring does not recompute it.
    #[arg(long)]
    pub swa_full: bool,
    /// Snapshots of a hybrid model's linear-attention states kept per sequence, so a
    /// rolled-back conversation resumes from the nearest one instead of recomputing from the
    /// start (each the size of the states).
    #[arg(long, default_value_t = moestream::runtime::options::DEFAULT_STATE_SNAPSHOTS)]
    pub state_snapshots: usize,
    /// GPU adapter by name substring or index (see `moestream devices`); env MOESTREAM_ADAPTER.
    #[arg(long)]
    pub adapter: Option<String>,
    /// GPU slots for routed experts (default: all experts if they fit in memory).
    #[arg(long, conflicts_with = "gpu_memory")]
    pub expert_slots: Option<usize>,
    /// GPU memory for routed experts, e.g. `512MiB`, `2GiB` (converted to slots).
    #[arg(long, value_parser = moestream::gpu::memory::parse_bytes)]
    pub gpu_memory: Option<u64>,
    /// Expert eviction policy when streaming.
    #[arg(long, value_enum, default_value = "eamc")]
    pub policy: Policy,
    /// Expert prefetcher when streaming.
    #[arg(long, value_enum, default_value = "eamc")]
    pub prefetch: Prefetch,
    /// Threads reading the expert store.
    #[arg(long, default_value_t = moestream::runtime::engine::DEFAULT_IO_THREADS)]
    pub io_threads: usize,
    /// Requests remembered by the EAMC collection.
    #[arg(long, default_value_t = moestream::experts::eam::DEFAULT_EAMC_CAPACITY)]
    pub eamc_capacity: usize,
    /// EAMC collection file, loaded at start and saved at exit.
    #[arg(long)]
    pub eamc: Option<PathBuf>,
    /// Write per-step, per-layer routed expert ids to this file (JSON lines).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Trained prerouter heads (from `prerouter train`) for `--prefetch prerouter` or
    /// `--routing predicted` (default: the model directory's `prerouter.safetensors`).
    #[arg(long)]
    pub prerouter: Option<PathBuf>,
    /// Expert routing of decode steps.
    #[arg(long, value_enum, default_value = "native")]
    pub routing: Routing,
    /// Read the expert store uncached (O_DIRECT, bypassing the page cache): `auto` when it
    /// exceeds the memory available (host or cgroup limit); a bare `--direct-io` means `on`.
    #[arg(long, value_enum, default_value = "auto", num_args = 0..=1, default_missing_value = "on")]
    pub direct_io: DirectIoArg,
    /// A PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors), applied
    /// unmerged on top of the model's weights.
    #[arg(long, value_name = "DIR")]
    pub lora: Option<PathBuf>,
    /// Most tokens one step runs (llama.cpp's `--ubatch-size`): a prompt is processed in chunks
    /// of this many, and parallel requests share steps of at most this many tokens. Larger
    /// steps read each streamed expert once for more prompt tokens and take more activation
    /// memory; the adapter may lower it (logged).
    #[arg(short = 'b', long, visible_alias = "ubatch-size", value_name = "N",
          default_value_t = moestream::runtime::options::DEFAULT_MAX_BATCH as u32,
          value_parser = clap::value_parser!(u32).range(1..=MAX_BATCH_SIZE as i64))]
    pub batch_size: u32,
}

/// The largest `--batch-size` accepted.
const MAX_BATCH_SIZE: usize = 8192;

/// The bundled model's directory: `$MOESTREAM_MODEL`, else `models/moestream-tiny-moe` in the
/// source tree this binary was built from.
pub fn default_model() -> PathBuf {
    std::env::var_os("MOESTREAM_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe"))
}

impl ModelArgs {
    /// The model directory to use.
    pub fn dir(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(default_model)
    }

    /// Loads the engine these flags describe.
    pub fn load(&self) -> Result<Engine> {
        Engine::load(&self.options()?)
    }

    /// Loads the engine with the MTP module as `mtp` says.
    pub fn load_with(&self, mtp: MtpLoad) -> Result<Engine> {
        Engine::load(&EngineOptions { mtp, ..self.options()? })
    }

    /// The engine options these flags describe.
    pub fn options(&self) -> Result<EngineOptions> {
        let mut o = base_options(&self.dir(), self.dtype)?;
        o.context = self.context;
        o.kv_dtype = self.kv_dtype.dtype();
        o.window_rings = !self.swa_full;
        o.state_snapshots = self.state_snapshots;
        o.mla_cache = match self.mla_cache {
            MlaCacheArg::Latent => MlaCacheKind::Latent,
            MlaCacheArg::Decompressed => MlaCacheKind::Decompressed,
        };
        o.gpu = GpuOptions { adapter: self.adapter.clone(), ..Default::default() };
        o.budget = match (self.expert_slots, self.gpu_memory) {
            (Some(n), _) => ExpertBudget::Slots(n),
            (None, Some(b)) => ExpertBudget::Bytes(b),
            (None, None) => ExpertBudget::Auto,
        };
        o.policy = match self.policy {
            Policy::Lru => PolicyKind::Lru,
            Policy::Lfu => PolicyKind::Lfu,
            Policy::Eamc => PolicyKind::Eamc,
            Policy::S3fifo => PolicyKind::S3fifo,
            Policy::Arc => PolicyKind::Arc,
        };
        o.prefetch = match self.prefetch {
            Prefetch::None => PrefetchKind::None,
            Prefetch::Eamc => PrefetchKind::Eamc,
            Prefetch::Prerouter => PrefetchKind::Prerouter,
            Prefetch::PrerouterEamc => PrefetchKind::PrerouterEamc,
        };
        o.routing = self.routing.mode();
        o.io_threads = self.io_threads;
        o.eamc_capacity = self.eamc_capacity;
        o.eamc_file = self.eamc.clone();
        o.trace = self.trace.clone();
        o.prerouter = self.prerouter.clone();
        o.direct_io = self.direct_io.mode();
        o.lora = self.lora.clone();
        o.cache_dir = self.cache_dir.clone();
        o.max_batch = self.batch_size as usize;
        Ok(o)
    }
}

/// Engine options for the model in `dir` at `dtype`, after checking `dir` is a model directory.
pub fn base_options(dir: &std::path::Path, dtype: Dtype) -> Result<EngineOptions> {
    check_exists(dir)?;
    let gguf = moestream::model::gguf::arch::is_gguf(dir);
    // `moestream convert FILE.gguf OUT` writes model.json and experts.bin, no config.json.
    if !gguf && !dir.join("config.json").exists() && !moestream::convert::is_converted(dir) {
        return Err(Error::InvalidArgument(format!(
            "{} is not a model directory (no config.json or model.json) or GGUF file; pass --model DIR or FILE.gguf",
            dir.display()
        )));
    }
    let format = match dtype {
        Dtype::F32 => WeightFormat::F32,
        Dtype::F16 => WeightFormat::F16,
        Dtype::Int4 => WeightFormat::Int4(QuantParams::default()),
    };
    Ok(EngineOptions::new(dir).with_format(format))
}

/// Says so when `path` (a model directory or file) does not exist.
pub fn check_exists(path: &std::path::Path) -> Result<()> {
    match path.exists() {
        true => Ok(()),
        false => Err(Error::InvalidArgument(format!("{} does not exist", path.display()))),
    }
}

/// Sampling flags (`generate`, `chat`). Each left out takes the model's default
/// ([`Engine::sampling_defaults`]: its `generation_config.json` or GGUF recommendation over
/// llama.cpp's temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.1).
#[derive(Args, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 = greedy. [default: the model's, else 0.8]
    #[arg(long, visible_alias = "temp", allow_negative_numbers = true)]
    pub temperature: Option<f32>,
    /// Keep the k most likely tokens; 0 = all. [default: the model's, else 40]
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling threshold, in (0, 1]. [default: the model's, else 0.95]
    #[arg(long, allow_negative_numbers = true)]
    pub top_p: Option<f32>,
    /// Drop tokens below this fraction of the most likely one's probability; 0 = off.
    /// [default: the model's, else 0.05]
    #[arg(long, allow_negative_numbers = true)]
    pub min_p: Option<f32>,
    /// Repetition penalty on the last --repeat-last-n tokens; 1 = off (llama.cpp's).
    /// [default: the model's, else 1.1]
    #[arg(long, allow_negative_numbers = true)]
    pub repeat_penalty: Option<f32>,
    /// Tokens the penalties look back over. [default: 64]
    #[arg(long)]
    pub repeat_last_n: Option<usize>,
    /// Subtracted from the logit of every token already there, in [-2, 2] (OpenAI's).
    /// [default: 0]
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    /// Subtracted per occurrence, in [-2, 2] (OpenAI's). [default: 0]
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    /// Random seed, for output that repeats run to run. [default: a fresh one each run]
    #[arg(long, short = 's')]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The flags given, as overrides of the model's defaults.
    pub fn overrides(&self) -> SamplingOverrides {
        SamplingOverrides {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: Some(self.seed.unwrap_or_else(fresh_seed)),
        }
    }

    /// Refuses bad values before a model is loaded (each is checked on its own, so llama.cpp's
    /// defaults stand in for the model's).
    pub fn validate(&self) -> Result<()> {
        self.overrides().over(SamplingParams::llama_cpp()).validate()
    }

    /// The sampling to run `engine` with: these flags over its defaults. Logged at info.
    pub fn sampling(&self, engine: &Engine) -> SamplingParams {
        let sampling = self.overrides().over(engine.sampling_defaults());
        log::info!("sampling: {sampling:?}");
        sampling
    }
}

/// Parses `1,2,3` into token ids.
pub fn parse_tokens(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|t| t.trim().parse::<u32>().map_err(|_| Error::InvalidArgument(format!("bad token id {t:?} in --tokens"))))
        .collect()
}

/// Where speculative decoding's drafts come from (`--speculative`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speculative {
    /// The model's own MTP module where it has one that runs, else prompt lookup when
    /// `--draft N` is given, else none.
    Auto,
    /// The model's multi-token-prediction module (DeepSeek-V3, GLM-4.5, Ling 2.5, Qwen3-Next,
    /// Qwen3.5/3.6-MoE checkpoints, the bundled model).
    Mtp,
    /// Prompt lookup: what followed the latest earlier occurrence of the last tokens.
    Ngram,
    /// One token a step.
    Off,
}

pub use moestream::runtime::drafts::DEFAULT_MTP_DRAFTS;

/// Prompt-lookup drafts a step with `--speculative ngram` unless `--draft` says otherwise.
const DEFAULT_LOOKUP_DRAFTS: usize = 4;

/// Speculative decoding flags of `generate`, `chat`, `serve` and `bench model`.
#[derive(clap::Args, Debug, Clone)]
pub struct DraftArgs {
    /// Where drafts come from; each step verifies them at once, and the output is what one
    /// token a step gives.
    #[arg(long, value_enum, default_value_t = Speculative::Auto)]
    pub speculative: Speculative,
    /// Draft up to N tokens a step [default: 3 from an MTP module, 4 by prompt lookup with
    /// `--speculative ngram`; with `auto` and no MTP module, drafts only when given]. 0 = off.
    #[arg(long, value_name = "N", alias = "draft-max")]
    pub draft: Option<usize>,
    /// Longest n-gram the prompt lookup matches.
    #[arg(long, value_name = "N", default_value_t = moestream::runtime::drafts::DEFAULT_LOOKUP_NGRAM)]
    pub draft_ngram: usize,
}

/// The drafts a request asks for: by prompt lookup, or this many a step from the MTP module.
#[derive(Clone, Copy, Debug, Default)]
pub struct DraftPlan {
    /// Prompt-lookup drafts.
    pub lookup: Option<moestream::runtime::drafts::PromptLookup>,
    /// MTP drafts a step (0: none).
    pub mtp: usize,
}

impl DraftArgs {
    /// Whether the engine loads the model's MTP module.
    pub fn mtp_load(&self) -> MtpLoad {
        match (self.speculative, self.draft) {
            (_, Some(0)) | (Speculative::Off | Speculative::Ngram, _) => MtpLoad::Off,
            (Speculative::Mtp, _) => MtpLoad::Required,
            (Speculative::Auto, _) => MtpLoad::Available,
        }
    }

    /// The drafts of requests on `engine`, loaded with [`DraftArgs::mtp_load`]; none for
    /// `constrained` requests (a grammar and drafts do not run together: asked for by name or
    /// with `--draft N`, that is an error).
    pub fn plan(&self, engine: &Engine, constrained: bool) -> Result<DraftPlan> {
        if constrained {
            return self.without(DRAFTS_WITH_A_CONSTRAINT);
        }
        if engine.routing() == RoutingMode::Predicted {
            return self.without(DRAFTS_WITH_PREDICTED_ROUTING);
        }
        match self.mtp_drafts() {
            n if n > 0 && engine.model().has_mtp() => Ok(DraftPlan { lookup: None, mtp: n }),
            _ => Ok(DraftPlan { lookup: self.lookup()?, mtp: 0 }),
        }
    }

    /// MTP drafts a step where the engine loads the module ([`DraftArgs::mtp_load`]; 0 where
    /// it does not).
    fn mtp_drafts(&self) -> usize {
        match self.mtp_load() {
            MtpLoad::Off => 0,
            MtpLoad::Available | MtpLoad::Required => self.draft.unwrap_or(DEFAULT_MTP_DRAFTS),
        }
    }

    /// The drafts of every unconstrained request of `serve`, checked before the model loads:
    /// the MTP drafts a step wherever the engine loads the module ([`DraftArgs::mtp_load`]),
    /// else the prompt lookup the flags ask for.
    pub fn for_serve(&self, routing: RoutingMode) -> Result<DraftPlan> {
        if routing == RoutingMode::Predicted {
            return self.without(DRAFTS_WITH_PREDICTED_ROUTING);
        }
        let mtp = self.mtp_drafts();
        if mtp > moestream::decoder::MAX_MTP_DRAFTS {
            let most = moestream::decoder::MAX_MTP_DRAFTS;
            return Err(Error::InvalidArgument(format!("draft length {mtp} must be in 1..={most}")));
        }
        Ok(DraftPlan { lookup: self.lookup()?, mtp })
    }

    /// No drafts, where they cannot run (`why`): an error where they were asked for by name
    /// (`--speculative mtp|ngram`, `--draft N`), `auto` goes without.
    fn without(&self, why: &str) -> Result<DraftPlan> {
        match matches!(self.speculative, Speculative::Mtp | Speculative::Ngram) || self.draft.unwrap_or(0) > 0 {
            true => Err(Error::UnsupportedConfig(why.into())),
            false => Ok(DraftPlan::default()),
        }
    }

    /// The prompt-lookup drafts the flags ask for, checked.
    pub fn lookup(&self) -> Result<Option<moestream::runtime::drafts::PromptLookup>> {
        let max_draft = match (self.speculative, self.draft) {
            (Speculative::Off | Speculative::Mtp, _) | (Speculative::Auto, None) | (_, Some(0)) => return Ok(None),
            (Speculative::Ngram, None) => DEFAULT_LOOKUP_DRAFTS,
            (_, Some(n)) => n,
        };
        let lookup = moestream::runtime::drafts::PromptLookup { ngram: self.draft_ngram, max_draft };
        lookup.validate()?;
        Ok(Some(lookup))
    }
}
