//! Plain f32 CPU forward pass of any [`ArchSpec`](crate::model::ArchSpec): the oracle for
//! tests, never the fast path.
//!
//! [`ops`] holds the per-op kernels (RMSNorm, matvec, RoPE, attention, router top-k, SwiGLU)
//! that GPU kernel tests compare against. [`ReferenceModel`] loads a small checkpoint fully
//! into host memory and runs it one token at a time with a KV cache ([`ReferenceSession`]),
//! following Hugging Face transformers' semantics in f32.

mod kv_cache;
mod layer;
pub mod linear_attention;
mod model;
mod mtp;
pub mod ops;
mod rounding;
mod session;

pub use kv_cache::KvCache;
pub use model::ReferenceModel;
pub use mtp::{ReferenceMtp, ReferenceMtpSession};
pub use session::ReferenceSession;
