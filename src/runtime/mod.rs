//! Running a model: the [`Engine`] (load, generate, score), sessions, sampling, tokenization,
//! stats.

pub mod engine;
pub mod memory;
pub mod sampler;
pub mod session;
pub mod stats;
pub mod tokenizer;

pub use engine::{Engine, EngineOptions, ExpertBudget, GenerateOptions, Generation, Score};
pub use memory::KvPlan;
pub use sampler::SamplingParams;
pub use session::Session;
pub use stats::Stats;
