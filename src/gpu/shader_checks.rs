//! Whether the kernels keep naga's runtime checks.
//!
//! naga makes every shader safe on its own: it clamps each dynamic index into a private or
//! workgroup array or a vector (`min(i, len - 1)`), clamps buffer indices where the driver does
//! not bound them itself, and counts every loop's iterations so that no loop can run forever.
//! The kernels need none of it: their loops run to bounds fixed by their parameters, and every
//! index into a private or workgroup array is a loop counter, a lane or an expert id the kernels
//! chose themselves, below the array's length (`tests/shader_checks.rs` runs models both ways
//! and compares every logit bit for bit). On lavapipe the clamps and counters cost about a fifth
//! of a decode step (`benches/README.md`). So on Vulkan adapters whose driver bounds every
//! buffer access itself (`robustBufferAccess`, which wgpu enables where the device has it, so
//! an out-of-range buffer access stays inside the buffer or is dropped), the kernels are built
//! without them; elsewhere (Metal, DX12, Vulkan without it) and with
//! `MOESTREAM_SHADER_CHECKS=on` they keep them. naga's integer-division checks always stay (a
//! division by zero is defined in WGSL; dropping them made no measured difference).

use crate::env_choice::env_choice;
use crate::error::Result;

/// Whether the kernels keep naga's runtime checks: unless the adapter's driver bounds buffer
/// accesses itself (`driver_bounds_buffers`), or `MOESTREAM_SHADER_CHECKS=on` or `force_checks`
/// asks for them.
pub(crate) fn keep_checks(driver_bounds_buffers: bool, force_checks: bool) -> Result<bool> {
    let forced = env_choice("MOESTREAM_SHADER_CHECKS", &[("on", true), ("auto", false)])?.unwrap_or(false);
    Ok(forced || force_checks || !driver_bounds_buffers)
}

/// The checks kernels are built with where they do not keep all of naga's: its integer-division
/// checks only.
pub(crate) fn division_checks_only() -> wgpu::ShaderRuntimeChecks {
    wgpu::ShaderRuntimeChecks {
        bounds_checks: false,
        force_loop_bounding: false,
        ..wgpu::ShaderRuntimeChecks::checked()
    }
}

/// Whether the adapter's driver keeps every buffer access in range itself: Vulkan's
/// `robustBufferAccess` (wgpu-hal requests it wherever the device offers it).
#[cfg(not(any(target_vendor = "apple", target_arch = "wasm32")))]
pub(crate) fn bounds_buffer_accesses(adapter: &wgpu::Adapter) -> bool {
    // SAFETY: the HAL adapter is only read (no handle is destroyed or kept).
    let Some(hal) = (unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }) else { return false };
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: the physical device belongs to `instance`, both alive while `hal` is.
    let features = unsafe { instance.get_physical_device_features(hal.raw_physical_device()) };
    features.robust_buffer_access != 0
}

/// No Vulkan here: every kernel keeps its checks.
#[cfg(any(target_vendor = "apple", target_arch = "wasm32"))]
pub(crate) fn bounds_buffer_accesses(_adapter: &wgpu::Adapter) -> bool {
    false
}
