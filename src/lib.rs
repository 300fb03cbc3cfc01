//! moestream: run mixture-of-experts language models on any wgpu GPU, streaming experts from SSD.
//!
//! The data path is `model` (checkpoint → [`model::ArchSpec`] + weights) → `decoder` (the
//! forward pass on the GPU: [`decoder::GpuModel`], its steps and KV caches, built from `ops`'
//! WGSL kernels on a `gpu` context, with routed experts in `experts`' slots) → `runtime` (the
//! [`Engine`]: loading, sessions, sampling). `reference` is the CPU oracle used by tests; `quant`
//! and `store` hold the element formats and the on-disk expert store; `util` the ground floor.
//! ARCHITECTURE.md has the map of the layers and what each may import (`tests/layering.rs`).
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
