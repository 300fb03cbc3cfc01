//! GPU access: adapter choice ([`adapter_choice`]), features and limits ([`context`]), typed buffers ([`buffers`]),
//! shader preprocessing and the pipeline cache ([`shader`]), kernel launching ([`kernel`]) into passes ([`pass`]), the
//! adapter's memory ([`memory`]), counts of the objects created ([`objects`]) and per-kernel timing ([`profiler`]).

mod adapter_choice;
pub mod buffers;
pub mod context;
pub mod kernel;
pub mod kernel_choices;
pub mod memory;
pub mod objects;
pub mod pass;
pub mod profiler;
pub mod shader;
mod shader_checks;

pub use buffers::{PendingRead, Readback, StepUniform, StepValues};
pub use context::{AdapterReport, Caps, Gpu, GpuOptions};
pub use kernel::Kernel;
pub use memory::GpuMemory;
pub use objects::ObjectCounts;
pub use pass::Pass;
