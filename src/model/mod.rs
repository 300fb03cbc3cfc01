//! Checkpoints: `config.json` → [`ArchSpec`] ([`config`]), safetensors loading ([`weights`]),
//! per-family tensor names ([`names`]), PEFT LoRA adapters ([`lora`]).

pub mod config;
pub mod config_limits;
pub mod gguf;
pub mod gpt_oss_weights;
pub mod hybrid_weights;
pub mod layer_weights;
pub mod lora;
pub mod mlx;
pub mod mtp;
pub mod names;
pub mod weights;

pub use config::{
    ArchSpec, AttentionKind, CacheShape, DeltaShape, ExpertAct, Family, GateAct, HybridSpec, LinearKind, MlaCacheKind,
    MlaSpec, MoeSpec, QkNorm, RopeScaling, RopeSpec, RoutingKind,
};
pub use weights::{Checkpoint, HostTensor};
