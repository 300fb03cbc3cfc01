//! One bound kernel launch: pipeline + bind group, recorded into a [`super::Pass`].
//!
//! Binding convention for every kernel: `@binding(0)` the per-step uniform
//! ([`super::buffers::StepValues`]), `@binding(1)` the kernel's static parameters (a uniform),
//! `@binding(2..)` storage buffers in the order the launcher passes them.

use std::sync::Arc;

use super::objects::Object;
use super::profiler::{Profiler, Traffic};
use super::{Gpu, Pass};

/// A part of a buffer to bind.
#[derive(Clone, Copy)]
pub struct Slice<'a> {
    /// The buffer.
    pub buffer: &'a wgpu::Buffer,
    /// Byte offset (a multiple of the device's storage offset alignment, 256).
    pub offset: u64,
    /// Byte length; `None` means to the end.
    pub size: Option<u64>,
}

impl<'a> From<&'a wgpu::Buffer> for Slice<'a> {
    fn from(buffer: &'a wgpu::Buffer) -> Self {
        Slice { buffer, offset: 0, size: None }
    }
}

/// A kernel with all its bindings resolved; dispatching it records one compute dispatch.
pub struct Kernel {
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    name: &'static str,
    traffic: Traffic,
    profiler: Option<Arc<Profiler>>,
}

impl Kernel {
    /// Binds shader `name` (variant `defines`) to the step uniform, a uniform holding `params`,
    /// and `storage` buffers at bindings 2, 3, ...
    pub fn new(
        gpu: &Gpu,
        name: &'static str,
        defines: &[&str],
        step: &wgpu::Buffer,
        params: &[u8],
        storage: &[Slice<'_>],
    ) -> Kernel {
        let pipeline = gpu.pipeline(name, defines);
        let params = gpu.uniform(name, params);
        let mut entries = vec![
            wgpu::BindGroupEntry { binding: 0, resource: step.as_entire_binding() },
            wgpu::BindGroupEntry { binding: 1, resource: params.as_entire_binding() },
        ];
        for (i, s) in storage.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: 2 + i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: s.buffer,
                    offset: s.offset,
                    size: s.size.and_then(wgpu::BufferSize::new),
                }),
            });
        }
        gpu.objects.created(Object::BindGroup);
        let bind_group = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        Kernel { pipeline, bind_group, name, traffic: Traffic::default(), profiler: gpu.profiler.clone() }
    }

    /// Sets the bytes a dispatch moves, for the profiler's bandwidth figures.
    pub fn with_traffic(mut self, traffic: Traffic) -> Kernel {
        self.traffic = traffic;
        self
    }

    /// Records a dispatch of `groups` workgroups, folded into x/y when over the per-dimension
    /// limit (kernels compute their linear id with [`super::shader`]'s `group_index`).
    pub fn dispatch(&self, pass: &mut Pass, groups: u32, max_per_dim: u32) {
        if groups == 0 {
            return;
        }
        let x = groups.min(max_per_dim);
        let y = groups.div_ceil(x);
        let dispatch = |pass: &mut wgpu::ComputePass<'_>| {
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &self.bind_group, &[]);
            pass.dispatch_workgroups(x, y, 1);
        };
        match &self.profiler {
            None => dispatch(pass.compute()),
            Some(p) => p.bracket(pass, self.name, self.traffic, dispatch),
        }
    }

    /// The shader this kernel runs.
    pub fn name(&self) -> &'static str {
        self.name
    }
}
