//! `moestream devices`.

use clap::Args;

use moestream::gpu::memory::MemorySource;
use moestream::gpu::Gpu;
use moestream::Result;

/// Flags of `devices`.
#[derive(Args, Debug)]
pub struct DevicesArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `devices`.
pub fn run(a: DevicesArgs) -> Result<()> {
    let adapters = Gpu::list_adapters();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&adapters).expect("serialisable"));
        return Ok(());
    }
    if adapters.is_empty() {
        println!("no GPU adapters found (install a Vulkan driver, e.g. mesa-vulkan-drivers)");
    } else {
        // The order is the choice: adapter_choice's rule.
        println!(
            "Adapters, best first (discrete, integrated, software; Vulkan or Metal before DX12): [0] is used unless \
             --adapter or MOESTREAM_ADAPTER names another"
        );
    }
    for d in adapters {
        println!(
            "[{}] {} ({}, {}{})",
            d.index,
            d.name,
            d.backend,
            d.device_type,
            if d.software { ", software" } else { "" }
        );
        println!("    driver: {}", d.driver);
        println!("    features: {}", if d.features.is_empty() { "none".into() } else { d.features.join(", ") });
        println!("    bench profile times dispatches by: {}", d.profile_timing.name());
        let [min, max] = d.subgroup_sizes;
        let decode = match d.software {
            true => "one lane per row (CPU layout)".to_string(),
            false => format!("teams of {} lanes", d.decode_team(d.features.iter().any(|f| f == "SUBGROUP"))),
        };
        println!("    subgroups of {min}-{max} lanes; decode kernels: {decode}");
        println!(
            "    kernel checks: {}",
            match d.driver_bounds_buffers {
                true => {
                    "the driver bounds buffer accesses (robustBufferAccess): without naga's index clamps and loop \
                     counters (MOESTREAM_SHADER_CHECKS=on keeps them)"
                }
                false => "all of naga's",
            }
        );
        println!(
            "    max storage binding {} MiB, max buffer {} MiB, {} storage buffers/stage, {} KiB workgroup memory",
            d.max_storage_binding >> 20,
            d.max_buffer >> 20,
            d.max_storage_buffers_per_stage,
            d.max_workgroup_storage >> 10
        );
        println!(
            "    memory: {} MiB, {} MiB free ({})",
            d.memory.total >> 20,
            d.memory.available >> 20,
            match d.memory.source {
                MemorySource::VulkanBudget => "Vulkan device-local heaps, VK_EXT_memory_budget",
                MemorySource::VulkanHeaps => "Vulkan device-local heaps",
                MemorySource::MetalWorkingSet => "Metal recommended working set",
                MemorySource::DxgiBudget => "DXGI video memory budget",
                MemorySource::Host => "host memory",
                MemorySource::Override => "MOESTREAM_GPU_MEMORY",
            }
        );
    }
    Ok(())
}
