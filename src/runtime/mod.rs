//! Running a model: the [`Engine`] (load, generate, score), sessions, sampling, tokenization,
//! stats.

pub mod collect_routing;
pub mod constraint;
pub mod direct_io;
pub mod drafts;
pub mod engine;
pub mod heap_trim;
pub mod logprobs;
pub mod memory_plan;
pub mod options;
pub mod penalties;
pub mod sampler;
pub mod sampling_defaults;
pub mod session;
pub mod stats;
pub mod tokenizer;

pub use constraint::Constraint;
pub use engine::{
    Engine, EngineOptions, ExpertBudget, Finished, GenerateOptions, Generation, MtpLoad, OnToken, RequestId, Scheduler,
    Score, DRAFTS_WITH_A_CONSTRAINT, DRAFTS_WITH_PREDICTED_ROUTING,
};
pub use memory_plan::KvPlan;
pub use sampler::SamplingParams;
pub use sampling_defaults::SamplingOverrides;
pub use session::Session;
pub use stats::Stats;
