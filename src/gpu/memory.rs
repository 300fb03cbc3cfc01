//! How much memory an adapter has, and how much the process may still allocate on it.
//!
//! Vulkan: the device-local heaps, and with `VK_EXT_memory_budget` the driver's current budget
//! minus what is already used. Metal: the device's `recommendedMaxWorkingSetSize` minus its
//! `currentAllocatedSize`. DX12: the local segment's `QueryVideoMemoryInfo` budget minus its
//! current usage, the adapter's dedicated video memory as the total. Software adapters
//! (lavapipe) allocate host memory, so the host's figures are theirs; integrated and
//! unified-memory adapters are also bounded by the host's free memory. The host's figures are
//! bounded by this process's memory cgroup's limit. A backend that cannot be
//! queried reports the host's memory with a warning (`--gpu-memory` overrides).
//! `MOESTREAM_GPU_MEMORY` (a size such as `8GiB`) or [`super::GpuOptions::memory_override`]
//! simulates an adapter of that size.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// Where an adapter's memory figures came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum MemorySource {
    /// Vulkan device-local heaps with `VK_EXT_memory_budget` (budget minus usage).
    VulkanBudget,
    /// Vulkan device-local heap sizes (no budget extension: nothing known to be in use).
    VulkanHeaps,
    /// Metal's `recommendedMaxWorkingSetSize` less the device's `currentAllocatedSize`.
    MetalWorkingSet,
    /// DX12 (DXGI) local-segment budget less current usage.
    DxgiBudget,
    /// The host's memory (software and unified-memory adapters, backends not queried).
    Host,
    /// Set by `MOESTREAM_GPU_MEMORY` or [`super::GpuOptions::memory_override`].
    Override,
}

/// An adapter's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GpuMemory {
    /// Memory the adapter has for buffers, in bytes (device-local heaps, or the host's RAM).
    pub total: u64,
    /// What this process may still allocate, in bytes (at most `total`).
    pub available: u64,
    /// Where the figures came from.
    pub source: MemorySource,
}

impl GpuMemory {
    /// An adapter of exactly `bytes`, all of it free.
    pub fn simulated(bytes: u64) -> GpuMemory {
        GpuMemory { total: bytes, available: bytes, source: MemorySource::Override }
    }

    /// Discovers `adapter`'s memory (see the module docs for each backend).
    pub fn discover(adapter: &wgpu::Adapter) -> GpuMemory {
        let info = adapter.get_info();
        let host = host_memory();
        // A software adapter's heap sizes are nominal: it allocates the host's memory.
        if info.device_type == wgpu::DeviceType::Cpu {
            return host;
        }
        let queried = GpuMemory::query(adapter);
        match queried {
            Some(mut memory) => {
                let shares_host = info.device_type == wgpu::DeviceType::IntegratedGpu
                    || memory.source == MemorySource::MetalWorkingSet;
                if shares_host {
                    // Shared with the host: its free memory bounds the adapter's.
                    memory.available = memory.available.min(host.available);
                }
                memory
            }
            None => {
                log::warn!(
                    "GPU memory of this {:?} adapter could not be queried: assuming the host's {} MiB; pass --gpu-memory to set the expert budget",
                    info.backend,
                    host.available >> 20
                );
                host
            }
        }
    }

    /// The backend's own figures: Vulkan's device-local heaps (with the budget when the driver
    /// offers `VK_EXT_memory_budget`), Metal's working set, DXGI's budget; `None` for a backend
    /// this build cannot query, or a query that fails.
    pub fn query(adapter: &wgpu::Adapter) -> Option<GpuMemory> {
        match adapter.get_info().backend {
            #[cfg(not(any(target_vendor = "apple", target_arch = "wasm32")))]
            wgpu::Backend::Vulkan => vulkan::memory(adapter),
            #[cfg(target_vendor = "apple")]
            wgpu::Backend::Metal => metal::memory(adapter),
            #[cfg(windows)]
            wgpu::Backend::Dx12 => dx12::memory(adapter),
            _ => None,
        }
    }

    /// The size `MOESTREAM_GPU_MEMORY` asks to simulate, if set.
    pub fn env_override() -> Result<Option<u64>, String> {
        match std::env::var("MOESTREAM_GPU_MEMORY") {
            Ok(text) => parse_bytes(&text).map(Some).map_err(|e| format!("MOESTREAM_GPU_MEMORY: {e}")),
            Err(_) => Ok(None),
        }
    }
}

/// The host's physical memory and what is available now, both within this process's memory
/// cgroup's limit (a software adapter, or a shared-memory one, cannot allocate past it).
pub fn host_memory() -> GpuMemory {
    let mut sys = sysinfo::System::new();
    sys.refresh_memory();
    let limit = cgroup_memory_limit().map_or(u64::MAX, |(limit, _)| limit);
    let total = sys.total_memory().min(limit);
    let available = sys.available_memory().min(total);
    GpuMemory { total, available, source: MemorySource::Host }
}

/// The lowest memory limit of this process's cgroup and its ancestors (cgroup v1
/// `memory.limit_in_bytes` or v2 `memory.max`), with the file it was read from; `None` when
/// unlimited or not on Linux.
pub fn cgroup_memory_limit() -> Option<(u64, PathBuf)> {
    let table = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let root = Path::new("/sys/fs/cgroup");
    let mut best: Option<(u64, PathBuf)> = None;
    for line in table.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (base, file) = if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else {
            continue;
        };
        let mut dir = Some(Path::new(path.trim_start_matches('/')));
        while let Some(d) = dir {
            let candidate = base.join(d).join(file);
            let limit = std::fs::read_to_string(&candidate).ok().and_then(|t| t.trim().parse::<u64>().ok());
            if let Some(limit) = limit.filter(|&l| best.as_ref().is_none_or(|(b, _)| l < *b)) {
                best = Some((limit, candidate));
            }
            dir = d.parent();
        }
    }
    best
}

/// Parses `123`, `512MiB`, `2GiB`, `1.5GB` into bytes (KB/MB/GB are powers of ten,
/// KiB/MiB/GiB powers of two).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let scale = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown size unit {other:?} (use B, KiB, MiB, GiB, KB, MB, GB)")),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("size {s:?} is too large"));
    }
    Ok(bytes as u64)
}

#[cfg(not(any(target_vendor = "apple", target_arch = "wasm32")))]
mod vulkan {
    use super::{GpuMemory, MemorySource};
    use ash::vk;

    /// Device-local heaps of a Vulkan adapter, with the budget extension when the device has it.
    pub fn memory(adapter: &wgpu::Adapter) -> Option<GpuMemory> {
        // SAFETY: the HAL adapter is only read (no handle is destroyed or kept).
        let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
        let shared = hal.shared_instance();
        let instance = shared.raw_instance();
        let phd = hal.raw_physical_device();
        // SAFETY: `phd` belongs to `instance`, both alive while `hal` is.
        let has_budget = unsafe { instance.enumerate_device_extension_properties(phd) }
            .map(|exts| exts.iter().any(|e| e.extension_name_as_c_str() == Ok(ash::ext::memory_budget::NAME)))
            .unwrap_or(false);
        let use_v2 = shared.instance_api_version() >= vk::API_VERSION_1_1;
        let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
        let props = if use_v2 {
            let mut props2 = vk::PhysicalDeviceMemoryProperties2::default();
            if has_budget {
                props2 = props2.push_next(&mut budget);
            }
            // SAFETY: as above; the chained struct outlives the call.
            unsafe { instance.get_physical_device_memory_properties2(phd, &mut props2) };
            props2.memory_properties
        } else {
            // SAFETY: as above.
            unsafe { instance.get_physical_device_memory_properties(phd) }
        };
        let with_budget = use_v2 && has_budget;
        let mut total = 0u64;
        let mut available = 0u64;
        for (i, heap) in props.memory_heaps_as_slice().iter().enumerate() {
            if !heap.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL) {
                continue;
            }
            total += heap.size;
            available += if with_budget {
                budget.heap_budget[i].saturating_sub(budget.heap_usage[i]).min(heap.size)
            } else {
                heap.size
            };
        }
        (total > 0).then_some(GpuMemory {
            total,
            available,
            source: if with_budget { MemorySource::VulkanBudget } else { MemorySource::VulkanHeaps },
        })
    }
}

#[cfg(target_vendor = "apple")]
mod metal {
    use super::{GpuMemory, MemorySource};
    use objc2_metal::MTLDevice;

    /// The device's recommended working set (the most it can use without hurting performance:
    /// on Apple silicon a share of the unified memory) less what the device has allocated.
    pub fn memory(adapter: &wgpu::Adapter) -> Option<GpuMemory> {
        // SAFETY: the HAL adapter is only read (no handle is destroyed or kept).
        let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Metal>() }?;
        let device = hal.raw_device();
        let total = device.recommendedMaxWorkingSetSize();
        let used = device.currentAllocatedSize() as u64;
        (total > 0).then_some(GpuMemory {
            total,
            available: total.saturating_sub(used),
            source: MemorySource::MetalWorkingSet,
        })
    }
}

#[cfg(windows)]
mod dx12 {
    use super::{GpuMemory, MemorySource};
    use windows::Win32::Graphics::Dxgi::{DXGI_MEMORY_SEGMENT_GROUP_LOCAL, DXGI_QUERY_VIDEO_MEMORY_INFO};

    /// The local segment's budget less its current usage (what the OS lets this process use
    /// now), and the adapter's dedicated video memory (the budget where it has none: an
    /// integrated adapter).
    pub fn memory(adapter: &wgpu::Adapter) -> Option<GpuMemory> {
        // SAFETY: the HAL adapter is only read (no handle is destroyed or kept).
        let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Dx12>() }?;
        let raw = hal.as_raw();
        let mut info = DXGI_QUERY_VIDEO_MEMORY_INFO::default();
        // SAFETY: `raw` is a live IDXGIAdapter3; `info` outlives the call.
        unsafe { raw.QueryVideoMemoryInfo(0, DXGI_MEMORY_SEGMENT_GROUP_LOCAL, &mut info) }.ok()?;
        // SAFETY: as above.
        let dedicated = unsafe { raw.GetDesc1() }.map_or(0, |d| d.DedicatedVideoMemory as u64);
        let total = if dedicated > 0 { dedicated } else { info.Budget };
        (total > 0).then_some(GpuMemory {
            total,
            available: info.Budget.saturating_sub(info.CurrentUsage).min(total),
            source: MemorySource::DxgiBudget,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_parse_with_units() {
        assert_eq!(parse_bytes("1024"), Ok(1024));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("1.5 KiB"), Ok(1536));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("-1G").is_err());
        assert!(parse_bytes("99999999999999999999999GiB").is_err());
    }
}
