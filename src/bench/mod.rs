//! Benchmarks behind `moestream bench`: kernel bandwidth ([`kernels`]), end-to-end model speed
//! ([`model`]), speed against context depth ([`context`]), per-kernel GPU time ([`profile`]) and the expert-streaming sweep ([`streaming`]).
//!
//! Each benchmark is a library function returning a serialisable report, so the command line
//! only parses flags and prints; `benches/README.md` shows how to run them and what the
//! reference figures are.

pub mod context;
pub mod kernels;
pub mod model;
pub mod profile;
pub mod streaming;
pub mod workload;

mod timing;
