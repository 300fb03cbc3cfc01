//! The names of the files a model directory may hold besides the checkpoint, in one place:
//! conversion copies or writes them, the engine, chat and the prerouter read them.

/// A Jinja chat template that overrides `tokenizer_config.json`'s.
pub const TEMPLATE_FILE: &str = "chat_template.jinja";
/// Trained prerouter heads.
pub const HEADS_FILE: &str = "prerouter.safetensors";
/// A converted model's expert store.
pub const EXPERTS_FILE: &str = "experts.bin";
/// A converted model's resident (non-expert) weights.
pub const RESIDENT_FILE: &str = "resident.safetensors";
/// A converted model's manifest.
pub const MANIFEST_FILE: &str = "model.json";
