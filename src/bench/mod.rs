//! Benchmarks behind `moestream bench`: kernel bandwidth ([`kernels`]), end-to-end model speed
//! ([`model`]), many requests at once ([`batch`]), every switchable fast path against the plain path it replaces ([`paths`]), speed against context depth ([`context`]), a model's cache bytes at given contexts ([`kv_size`]), per-kernel GPU time ([`profile`]), the expert-streaming sweep ([`streaming`]) and experts streamed from disk for a model bigger than memory ([`ssd`], with the device probe [`device_read`]).
//!
//! Each benchmark is a library function returning a serialisable report, so the command line
//! only parses flags and prints; `benches/README.md` shows how to run them and what the
//! reference figures are.

pub mod attention_bandwidth;
pub mod batch;
pub mod context;
pub mod device_read;
pub mod kernels;
pub mod kv_size;
pub mod model;
pub mod paths;
pub mod profile;
pub mod ssd;
pub mod streaming;
pub mod workload;

mod timing;
