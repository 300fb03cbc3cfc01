//! Which adapter the engine opens when several are offered, and which one it falls back to.
//!
//! One GPU can appear several times, once per graphics API: on Windows a GPU with a Vulkan
//! driver is offered through Vulkan and through DX12. The rule: a discrete GPU before an
//! integrated one before a virtual one before a software one, and for the same kind of device,
//! Vulkan or Metal before DX12 before OpenGL. Vulkan is the API the test suite runs on (lavapipe,
//! and the Windows build under Wine), and it offers subgroups and 8-byte integers, which DX12
//! lacks wherever wgpu compiles with FXC (shader model 5.1, its default). A DX12 adapter that
//! cannot be opened or fails to build a kernel falls back to a Vulkan adapter, the same GPU's
//! where one is known ([`vulkan_fallback`]), with a warning.

/// The sort key of an adapter: lower is preferred ([`Gpu::list_adapters`] order).
///
/// [`Gpu::list_adapters`]: super::Gpu::list_adapters
pub(crate) fn preference(info: &wgpu::AdapterInfo) -> (u32, u32) {
    let device = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let api = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal => 0,
        wgpu::Backend::Dx12 => 1,
        wgpu::Backend::Gl => 2,
        _ => 3,
    };
    (device, api)
}

/// Where a DX12 adapter `adapters[chosen]` falls back to: the position in `adapters` (sorted by
/// [`preference`]) of the same GPU's Vulkan adapter (same PCI vendor and device id, or the same
/// name where the driver reports no ids), else of the first Vulkan adapter (Wine, for one, names
/// its DX12 adapter after no real GPU); `None` for any other API or where no Vulkan adapter
/// exists.
pub(crate) fn vulkan_fallback(adapters: &[wgpu::AdapterInfo], chosen: usize) -> Option<usize> {
    let dx12 = adapters.get(chosen).filter(|a| a.backend == wgpu::Backend::Dx12)?;
    let same_gpu = |a: &wgpu::AdapterInfo| match (dx12.vendor, dx12.device) {
        (0, 0) => a.name == dx12.name,
        ids => (a.vendor, a.device) == ids,
    };
    let vulkan = |a: &&wgpu::AdapterInfo| a.backend == wgpu::Backend::Vulkan;
    let twin = adapters.iter().position(|a| vulkan(&a) && same_gpu(a));
    twin.or_else(|| adapters.iter().position(|a| vulkan(&a)))
}

/// Whether a GPU error message is a kernel that failed to build (a shader compiler's error):
/// wgpu reports those from `Device::create_shader_module` or `Device::create_compute_pipeline`.
pub(crate) fn is_kernel_build_failure(message: &str) -> bool {
    message.contains("Device::create_compute_pipeline") || message.contains("Device::create_shader_module")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter(
        name: &str,
        backend: wgpu::Backend,
        device_type: wgpu::DeviceType,
        ids: (u32, u32),
    ) -> wgpu::AdapterInfo {
        wgpu::AdapterInfo {
            name: name.into(),
            vendor: ids.0,
            device: ids.1,
            ..wgpu::AdapterInfo::new(device_type, backend)
        }
    }

    #[test]
    fn discrete_first_then_vulkan_before_dx12() {
        use wgpu::{Backend, DeviceType};
        let mut list = vec![
            adapter("WARP", Backend::Dx12, DeviceType::Cpu, (0x1414, 0x8c)),
            adapter("iGPU", Backend::Dx12, DeviceType::IntegratedGpu, (0x8086, 1)),
            adapter("dGPU", Backend::Dx12, DeviceType::DiscreteGpu, (0x10de, 2)),
            adapter("dGPU", Backend::Vulkan, DeviceType::DiscreteGpu, (0x10de, 2)),
            adapter("llvmpipe", Backend::Vulkan, DeviceType::Cpu, (0x10005, 0)),
            adapter("iGPU", Backend::Vulkan, DeviceType::IntegratedGpu, (0x8086, 1)),
        ];
        list.sort_by_key(preference);
        let order: Vec<_> = list.iter().map(|a| format!("{} {:?}", a.name, a.backend)).collect();
        assert_eq!(order, ["dGPU Vulkan", "dGPU Dx12", "iGPU Vulkan", "iGPU Dx12", "llvmpipe Vulkan", "WARP Dx12"]);
        // A DX12 adapter falls back to its own GPU's Vulkan adapter, WARP (no Vulkan twin) to the
        // best Vulkan one; Vulkan adapters fall back to nothing.
        assert_eq!(vulkan_fallback(&list, 1), Some(0));
        assert_eq!(vulkan_fallback(&list, 3), Some(2));
        assert_eq!(vulkan_fallback(&list, 5), Some(0));
        assert_eq!(vulkan_fallback(&list, 0), None);
        assert_eq!(vulkan_fallback(&list, 9), None);
        assert_eq!(vulkan_fallback(&list[3..4], 0), None);
    }

    #[test]
    fn same_gpu_by_name_where_ids_are_missing() {
        use wgpu::{Backend, DeviceType};
        let list = [
            adapter("GPU A", Backend::Vulkan, DeviceType::DiscreteGpu, (0, 0)),
            adapter("GPU B", Backend::Vulkan, DeviceType::DiscreteGpu, (0, 0)),
            adapter("GPU B", Backend::Dx12, DeviceType::DiscreteGpu, (0, 0)),
        ];
        assert_eq!(vulkan_fallback(&list, 2), Some(1));
    }

    #[test]
    fn kernel_build_failures_are_told_from_other_gpu_errors() {
        let fxc = "Validation Error\n\nCaused by:\n  In Device::create_compute_pipeline, label = 'matmul'\n    \
                   Internal error: FXC D3DCompile error (0x80004005): error X4026";
        assert!(is_kernel_build_failure(fxc));
        assert!(!is_kernel_build_failure("In Device::create_buffer, label = 'kv'\n  Not enough memory left"));
    }
}
