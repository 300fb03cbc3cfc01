//! The library's error type: every failure a user can cause is a named variant, never a panic.

use std::path::PathBuf;

/// Everything that can go wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A step this request shared with others failed (the first of them got the cause).
    #[error("a batched step failed: {0}")]
    BatchStepFailed(String),
    /// A file could not be read or written.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A JSON file is malformed or misses a required field.
    #[error("invalid JSON in {path}: {message}")]
    Json {
        /// The file involved.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// `config.json` names an architecture moestream does not run.
    #[error("unsupported architecture {0:?}; supported: MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, Glm4MoeForCausalLM")]
    UnsupportedArchitecture(String),
    /// The configuration has a value moestream cannot honour.
    #[error("unsupported configuration: {0}")]
    UnsupportedConfig(String),
    /// A required configuration field is missing or has the wrong type.
    #[error("config.json: missing or invalid field `{0}`")]
    ConfigField(String),
    /// A size or value of a model description is out of its range or inconsistent with the
    /// others (see [`crate::model::config_limits`]).
    #[error("config field `{field}` = {value} is out of range (expected {expected})")]
    ConfigValue {
        /// The field, as `config.json` names it.
        field: String,
        /// The value found.
        value: String,
        /// What is accepted.
        expected: String,
    },
    /// A tensor the architecture needs is absent from the checkpoint.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// A tensor has another shape than the architecture implies.
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Shape found in the file.
        actual: Vec<usize>,
        /// Shape the configuration implies.
        expected: Vec<usize>,
    },
    /// A tensor is stored in a dtype moestream cannot read.
    #[error("tensor `{name}` has unsupported dtype {dtype}; expected BF16, F16 or F32")]
    TensorDtype {
        /// Tensor name.
        name: String,
        /// The dtype found.
        dtype: String,
    },
    /// A safetensors file is malformed.
    #[error("invalid safetensors file {path}: {message}")]
    Safetensors {
        /// The file involved.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// No model weights were found in a directory.
    #[error("no model weights (*.safetensors) in {0}")]
    NoWeights(PathBuf),
    /// The tokenizer could not be loaded or failed on the input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A step's output (logits, or the log-probabilities computed from them) holds NaN or an
    /// infinity: a weight of the model (or a value computed from it) is not a finite number.
    /// Refused rather than turned into tokens.
    #[error(
        "the model computed non-finite {what} at position {position}: a weight is NaN or infinite, or \
         overflows (a corrupt checkpoint?)"
    )]
    NonFiniteOutput {
        /// `logits` or `log-probabilities`.
        what: &'static str,
        /// The sequence position whose output it is.
        position: usize,
    },
    /// A token id is outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// The prompt plus requested generation does not fit the context window.
    #[error("sequence of {requested} tokens exceeds the context of {context} tokens")]
    ContextOverflow {
        /// Tokens the request needs.
        requested: usize,
        /// The engine's context length.
        context: usize,
    },
    /// A KV cache (the context asked for, or one more session's cache) does not fit the memory
    /// left for KV caches; nothing was allocated.
    #[error("a KV cache of {needed} bytes ({what}) does not fit: {available} bytes are left for KV caches")]
    KvCacheTooLarge {
        /// What asked for it.
        what: String,
        /// Bytes it needs.
        needed: u64,
        /// Bytes still free for KV caches.
        available: u64,
    },
    /// An empty prompt was given.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// No usable GPU adapter was found, or the requested one does not exist.
    #[error("GPU adapter: {0}")]
    Adapter(String),
    /// The GPU device failed (lost device, validation error).
    #[error("GPU error: {0}")]
    Gpu(String),
    /// The driver refused an allocation.
    #[error("the GPU refused an allocation while {allocated} bytes were allocated ({available} bytes were free when the adapter was opened): {message}; lower --context or the expert budget (--gpu-memory / --expert-slots)")]
    OutOfGpuMemory {
        /// Bytes this context had allocated, the refused buffers included.
        allocated: u64,
        /// Bytes the adapter reported free when it was opened.
        available: u64,
        /// The driver's message.
        message: String,
    },
    /// The expert store or quantized data is invalid.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// Invalid argument from the caller.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Generation was cancelled by the caller.
    #[error("cancelled")]
    Cancelled,
    /// A LoRA adapter's configuration or files cannot be used with this model.
    #[error("LoRA adapter {path}: {message}")]
    Lora {
        /// The adapter file involved.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A LoRA adapter holds a tensor for a module moestream does not adapt.
    #[error("LoRA tensor `{0}` is not supported; adapters may target self_attn.{{q,k,v,o}}_proj, mlp.{{gate,up,down}}_proj of dense layers and mlp.shared_expert.{{gate,up,down}}_proj, as lora_A / lora_B weights")]
    UnsupportedLoraTensor(String),
    /// A GGUF file is malformed or holds what moestream does not read.
    #[error(transparent)]
    Gguf(#[from] crate::model::gguf::GgufError),
    /// A chat template failed to compile or refused a conversation.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A conversation needs a chat template and the model directory has none.
    #[error("{0} has no chat template: pass --chat-template FILE (a Jinja chat template), or use raw prompts (generate, /v1/completions)")]
    NoChatTemplate(PathBuf),
    /// A file of a converted model does not match the size or checksum its manifest records.
    #[error("corrupt file {path}: {detail}")]
    Corrupt {
        /// The file involved.
        path: PathBuf,
        /// What does not match.
        detail: String,
    },
}

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}
