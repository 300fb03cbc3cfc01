//! Running a model: the [`Engine`] (load, generate, score), sampling, tokenization, stats.

pub mod engine;
pub mod memory_plan;
pub mod sampler;
pub mod stats;
pub mod tokenizer;

pub use engine::{Engine, EngineOptions, ExpertBudget, GenerateOptions, Generation, Score};
pub use sampler::SamplingParams;
pub use stats::Stats;
