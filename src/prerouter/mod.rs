//! The prerouter (Edge0): small per-layer heads that predict the next MoE layer's experts one
//! token ahead, so expert reads can start while the current token is still computing.
//!
//! Exact routing of MoE layer N+1 needs layer N's output, so its reads start late. The head owned
//! by MoE layer N reads, right after token t, `[h_N(t), multi-hot top-k of layer N+1 at t,
//! multi-hot top-k of layer N+1 at t−1]` (`h_N`: layer N's FFN input, the post-attention RMSNorm
//! output) and scores layer N+1's experts for token t+1:
//!
//! ```text
//! head(x) = fc2(gelu_erf(fc1(x))) + skip(h_N)      skip initialised from layer N+1's router
//! ```
//!
//! The pieces, one job each:
//! - [`dataset`]: the on-disk training data (`meta.json`, `hidden.f32`, `topk.u16`), written
//!   token by token with bounded memory and read back with every size checked;
//! - [`features`]: which inputs a head reads and how a sample's input is assembled;
//! - [`head`]: one head's parameters, forward pass and hand-written backward pass;
//! - [`loss`]: softmax cross-entropy or binary cross-entropy against the routed set;
//! - [`adam`]: the optimiser;
//! - [`metrics`]: top-k selection, recall@k and exact-set match;
//! - [`samples`]: which tokens are samples, the held-out split, a head's input and target;
//! - [`score`]: one head scored on samples beside the persistence and router baselines;
//! - [`train`]: the training loop, scored on the held-out split;
//! - [`eval`]: trained heads scored on routing collected from another text;
//! - [`parallel`]: per-head jobs on a few threads;
//! - [`routers`] + [`compat`]: the model's routers (skip initialisation, baseline) and the
//!   dimension checks between models, datasets and heads files;
//! - [`heads_file`]: saving and loading trained heads as safetensors, with typed errors;
//! - [`error`]: those errors.
//!
//! The data comes from `runtime::collect_routing` (teacher-forced text through an engine with a
//! layer observer); the decoder attaches trained heads (`decoder::GpuModel::attach_prerouter_file`),
//! where they run on the GPU after each step (`--prefetch prerouter`: a prefetch hint, routing
//! stays exact; `--routing predicted`: Edge0's prediction-as-routing).

pub mod adam;
pub mod compat;
pub mod dataset;
pub mod error;
pub mod eval;
pub mod features;
pub mod head;
pub mod heads_file;
pub mod loss;
pub mod metrics;
pub mod parallel;
pub mod routers;
pub mod samples;
pub mod score;
pub mod train;

pub use error::PrerouterError;
