//! Loading and freeing an engine.

use std::ffi::c_char;

use moestream::chat::{end_of_turn_tokens, ChatTemplate};
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::ops::{KvDtype, WeightFormat};
use moestream::quant::QuantParams;
use moestream::runtime::{EngineOptions, ExpertBudget, MtpLoad};
use moestream::{Engine, Error, Result};

use crate::boundary::{guard, str_arg};
use crate::sized::{read_sized, SizedStruct};

/// `MoestreamLoadOptions.policy`: least recently used.
pub const MOESTREAM_POLICY_LRU: u32 = 0;
/// `MoestreamLoadOptions.policy`: least frequently used.
pub const MOESTREAM_POLICY_LFU: u32 = 1;
/// `MoestreamLoadOptions.policy`: MoE-Infinity's activation-matrix priority (default).
pub const MOESTREAM_POLICY_EAMC: u32 = 2;
/// `MoestreamLoadOptions.prefetch`: load experts on demand only.
pub const MOESTREAM_PREFETCH_NONE: u32 = 0;
/// `MoestreamLoadOptions.prefetch`: prefetch what the EAM collection predicts (default).
pub const MOESTREAM_PREFETCH_EAMC: u32 = 1;
/// `MoestreamLoadOptions.prefetch`: prefetch what the prerouter heads predict.
pub const MOESTREAM_PREFETCH_PREROUTER: u32 = 2;
/// `MoestreamLoadOptions.prefetch`: the prerouter's prediction, then EAMC's.
pub const MOESTREAM_PREFETCH_PREROUTER_EAMC: u32 = 3;
/// `MoestreamLoadOptions.weights`: 16-bit floats (default for Hugging Face directories).
pub const MOESTREAM_WEIGHTS_F16: u32 = 0;
/// `MoestreamLoadOptions.weights`: 32-bit floats.
pub const MOESTREAM_WEIGHTS_F32: u32 = 1;
/// `MoestreamLoadOptions.weights`: int4 (converted once into the cache).
pub const MOESTREAM_WEIGHTS_INT4: u32 = 2;

/// `MoestreamLoadOptions.kv_cache_type`: 16-bit floats (default).
pub const MOESTREAM_KV_F16: u32 = 0;
/// `MoestreamLoadOptions.kv_cache_type`: 32-bit floats.
pub const MOESTREAM_KV_F32: u32 = 1;
/// `MoestreamLoadOptions.kv_cache_type`: llama.cpp's q8_0 (int8 in blocks of 32 with an f16
/// scale): about half f16's memory.
pub const MOESTREAM_KV_Q8_0: u32 = 2;
/// `MoestreamLoadOptions.kv_cache_type`: llama.cpp's q4_0 (4-bit codes in blocks of 32 with an
/// f16 scale): about 0.28× f16's memory, with a visible loss.
pub const MOESTREAM_KV_Q4_0: u32 = 3;

/// `MoestreamLoadOptions.mtp`: the model's multi-token-prediction module is not loaded
/// (default).
pub const MOESTREAM_MTP_OFF: u32 = 0;
/// `MoestreamLoadOptions.mtp`: loaded where the model has one that runs (DeepSeek-V3, GLM-4.5,
/// Ling 2.5, Qwen3-Next, Qwen3.5/3.6-MoE checkpoints and their GGUF files), else the engine loads
/// without it.
pub const MOESTREAM_MTP_AVAILABLE: u32 = 1;
/// `MoestreamLoadOptions.mtp`: loaded, or the load fails saying why not.
pub const MOESTREAM_MTP_REQUIRED: u32 = 2;

/// How to load a model; fill with `moestream_load_options_default`, then set `model_dir`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MoestreamLoadOptions {
    /// `sizeof(MoestreamLoadOptions)` as the app was compiled (set by the default function).
    pub struct_size: u32,
    /// Model directory (Hugging Face layout or converted), UTF-8. Required.
    pub model_dir: *const c_char,
    /// KV-cache length in tokens; 0 = the model's maximum, at most 4096.
    pub context: u32,
    /// GPU slots for routed experts; 0 = decided by `expert_memory_bytes`.
    pub expert_slots: u32,
    /// GPU memory for routed experts in bytes; 0 (with `expert_slots` 0) = every expert if
    /// they fit in memory.
    pub expert_memory_bytes: u64,
    /// Eviction policy when streaming: `MOESTREAM_POLICY_*`.
    pub policy: u32,
    /// Prefetcher when streaming: `MOESTREAM_PREFETCH_*`.
    pub prefetch: u32,
    /// Weight precision for Hugging Face directories: `MOESTREAM_WEIGHTS_*`.
    pub weights: u32,
    /// GPU adapter by name substring or index; NULL = the best one.
    pub adapter: *const c_char,
    /// KV-cache element type: `MOESTREAM_KV_*` (added in the second version of this struct).
    pub kv_cache_type: u32,
    /// Sliding-window layers keep every position instead of a ring of their window (more
    /// memory; a session rolled back past the ring then resumes without recomputing).
    pub swa_full: bool,
    /// The model's MTP module, for `MoestreamGenerateOptions.draft_source`
    /// `MOESTREAM_DRAFTS_MTP`: `MOESTREAM_MTP_*` (added in the third version of this struct).
    pub mtp: u32,
}

/// A loaded model (opaque).
pub struct MoestreamEngine {
    pub(crate) engine: Engine,
    pub(crate) template: Option<ChatTemplate>,
    pub(crate) end_of_turn: Vec<u32>,
}

/// Fills `options` with the defaults (no model directory).
///
/// # Safety
/// `options` is NULL or points to writable memory for one `MoestreamLoadOptions`.
#[no_mangle]
pub unsafe extern "C" fn moestream_load_options_default(options: *mut MoestreamLoadOptions) {
    if options.is_null() {
        return;
    }
    options.write(default_load_options());
}

fn default_load_options() -> MoestreamLoadOptions {
    MoestreamLoadOptions {
        struct_size: std::mem::size_of::<MoestreamLoadOptions>() as u32,
        model_dir: std::ptr::null(),
        context: 0,
        expert_slots: 0,
        expert_memory_bytes: 0,
        policy: MOESTREAM_POLICY_EAMC,
        prefetch: MOESTREAM_PREFETCH_EAMC,
        weights: MOESTREAM_WEIGHTS_F16,
        adapter: std::ptr::null(),
        kv_cache_type: MOESTREAM_KV_F16,
        swa_full: false,
        mtp: MOESTREAM_MTP_OFF,
    }
}

impl SizedStruct for MoestreamLoadOptions {
    const NAME: &'static str = "MoestreamLoadOptions";
    const FIRST_SIZE: usize = std::mem::offset_of!(Self, kv_cache_type);
}

/// Loads a model; NULL on failure (see `moestream_last_error`). Free with
/// `moestream_engine_free`.
///
/// # Safety
/// `options` points to a valid `MoestreamLoadOptions` whose strings are NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn moestream_engine_load(options: *const MoestreamLoadOptions) -> *mut MoestreamEngine {
    guard(std::ptr::null_mut(), || {
        if options.is_null() {
            return Err(Error::InvalidArgument("options is NULL".into()));
        }
        let o = read_sized(options, default_load_options())?;
        let engine = Engine::load(&engine_options(&o)?)?;
        let template = ChatTemplate::from_dir(engine.model_dir())?;
        let end_of_turn = end_of_turn_tokens(&engine, template.as_ref());
        Ok(Box::into_raw(Box::new(MoestreamEngine { engine, template, end_of_turn })))
    })
}

/// The engine options `o` describes, every enum value checked.
unsafe fn engine_options(o: &MoestreamLoadOptions) -> Result<EngineOptions> {
    let dir = str_arg(o.model_dir, "model_dir")?;
    let weights = match o.weights {
        MOESTREAM_WEIGHTS_F16 => WeightFormat::F16,
        MOESTREAM_WEIGHTS_F32 => WeightFormat::F32,
        MOESTREAM_WEIGHTS_INT4 => WeightFormat::Int4(QuantParams::default()),
        w => return Err(Error::InvalidArgument(format!("weights {w} is not a MOESTREAM_WEIGHTS_* value"))),
    };
    let mut options = EngineOptions::new(dir).with_format(weights);
    options.context = (o.context > 0).then_some(o.context as usize);
    options.budget = match (o.expert_slots, o.expert_memory_bytes) {
        (0, 0) => ExpertBudget::Auto,
        (0, bytes) => ExpertBudget::Bytes(bytes),
        (slots, _) => ExpertBudget::Slots(slots as usize),
    };
    options.policy = match o.policy {
        MOESTREAM_POLICY_LRU => PolicyKind::Lru,
        MOESTREAM_POLICY_LFU => PolicyKind::Lfu,
        MOESTREAM_POLICY_EAMC => PolicyKind::Eamc,
        p => return Err(Error::InvalidArgument(format!("policy {p} is not a MOESTREAM_POLICY_* value"))),
    };
    options.prefetch = match o.prefetch {
        MOESTREAM_PREFETCH_NONE => PrefetchKind::None,
        MOESTREAM_PREFETCH_EAMC => PrefetchKind::Eamc,
        MOESTREAM_PREFETCH_PREROUTER => PrefetchKind::Prerouter,
        MOESTREAM_PREFETCH_PREROUTER_EAMC => PrefetchKind::PrerouterEamc,
        p => return Err(Error::InvalidArgument(format!("prefetch {p} is not a MOESTREAM_PREFETCH_* value"))),
    };
    options.kv_dtype = match o.kv_cache_type {
        MOESTREAM_KV_F16 => KvDtype::F16,
        MOESTREAM_KV_F32 => KvDtype::F32,
        MOESTREAM_KV_Q8_0 => KvDtype::Q8_0,
        MOESTREAM_KV_Q4_0 => KvDtype::Q4_0,
        k => return Err(Error::InvalidArgument(format!("kv_cache_type {k} is not a MOESTREAM_KV_* value"))),
    };
    options.window_rings = !o.swa_full;
    options.mtp = match o.mtp {
        MOESTREAM_MTP_OFF => MtpLoad::Off,
        MOESTREAM_MTP_AVAILABLE => MtpLoad::Available,
        MOESTREAM_MTP_REQUIRED => MtpLoad::Required,
        m => return Err(Error::InvalidArgument(format!("mtp {m} is not a MOESTREAM_MTP_* value"))),
    };
    if !o.adapter.is_null() {
        options.gpu.adapter = Some(str_arg(o.adapter, "adapter")?.to_string());
    }
    Ok(options)
}

/// Frees an engine (NULL is ignored).
///
/// # Safety
/// `engine` is NULL or a handle from `moestream_engine_load`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn moestream_engine_free(engine: *mut MoestreamEngine) {
    if !engine.is_null() {
        guard((), || {
            drop(Box::from_raw(engine));
            Ok(())
        });
    }
}

/// The engine behind a handle.
pub(crate) unsafe fn engine_ref<'a>(engine: *const MoestreamEngine) -> Result<&'a MoestreamEngine> {
    engine.as_ref().ok_or_else(|| Error::InvalidArgument("engine is NULL".into()))
}
