//! Counts of the GPU objects a context has created: pipelines (each with the bind group layout
//! wgpu derives for it), shader modules, bind groups and buffers. A decode step must create none
//! of them (every kernel is bound when the model is built); tests/no_objects_per_step.rs checks
//! that, since a driver that builds or keeps something per dispatch makes every token slower
//! and the process bigger.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Objects created so far, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ObjectCounts {
    /// Compute pipelines (and with each its derived bind group layout).
    pub pipelines: u64,
    /// Shader modules.
    pub shader_modules: u64,
    /// Bind groups.
    pub bind_groups: u64,
    /// Buffers (storage, uniform, staging).
    pub buffers: u64,
}

/// The live counters behind [`ObjectCounts`].
#[derive(Default)]
pub(crate) struct ObjectCounters {
    pipelines: AtomicU64,
    shader_modules: AtomicU64,
    bind_groups: AtomicU64,
    buffers: AtomicU64,
}

/// One kind of object.
#[derive(Clone, Copy)]
pub(crate) enum Object {
    Pipeline,
    ShaderModule,
    BindGroup,
    Buffer,
}

impl ObjectCounters {
    /// Counts one more `object`.
    pub(crate) fn created(&self, object: Object) {
        let counter = match object {
            Object::Pipeline => &self.pipelines,
            Object::ShaderModule => &self.shader_modules,
            Object::BindGroup => &self.bind_groups,
            Object::Buffer => &self.buffers,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn snapshot(&self) -> ObjectCounts {
        ObjectCounts {
            pipelines: self.pipelines.load(Ordering::Relaxed),
            shader_modules: self.shader_modules.load(Ordering::Relaxed),
            bind_groups: self.bind_groups.load(Ordering::Relaxed),
            buffers: self.buffers.load(Ordering::Relaxed),
        }
    }
}
