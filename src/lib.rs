//! moestream: run mixture-of-experts language models on any wgpu GPU, streaming experts from SSD.
//!
//! The data path is `model` (checkpoint → [`model::ArchSpec`] + weights) → `gpu` + `ops`
//! (WGSL kernels) → `runtime` (engine, KV cache, sampler). `reference` is the CPU oracle used
//! by tests; `quant` and `store` hold the int4 format and the on-disk expert store.
#![warn(missing_docs)]

pub mod bench;
pub mod chat;
pub mod convert;
pub mod decoder;
mod env_choice;
pub mod error;
pub mod experts;
pub mod gpu;
pub mod model;
pub mod ops;
pub mod prerouter;
pub mod quant;
pub mod reference;
pub mod runtime;
#[cfg(feature = "serve")]
pub mod serve;
pub mod sim;

pub use runtime::{Engine, EngineOptions, Session};
pub mod store;
pub mod util;

pub use error::{Error, Result};
