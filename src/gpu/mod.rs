//! GPU access: adapter choice, features and limits ([`context`]), typed buffers ([`buffers`]),
//! shader preprocessing and the pipeline cache ([`shader`]), and kernel launching ([`kernel`]).

pub mod buffers;
pub mod context;
pub mod kernel;
pub mod shader;

pub use buffers::{Readback, StepUniform};
pub use context::{AdapterReport, Caps, Gpu, GpuOptions};
pub use kernel::Kernel;
