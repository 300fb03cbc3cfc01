//! Adapter selection and device creation.
//!
//! High-performance adapters come first; `--adapter NAME|INDEX` or the `MOESTREAM_ADAPTER`
//! environment variable picks another. Software adapters (lavapipe) are accepted and reported.
//! Optional features (SUBGROUP, SHADER_F16, TIMESTAMP_QUERY) are requested when offered and the
//! kernels fall back to shared-memory variants when they are missing.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::kernel_choices::{ExpertPrefill, LayoutChoice};
use super::memory::GpuMemory;
use super::objects::{Object, ObjectCounters, ObjectCounts};
use super::profiler::{ProfileTiming, Profiler};
use super::{adapter_choice, shader_checks};
use crate::env_choice::env_choice;
use crate::error::{Error, Result};

/// Bytes of uploads a load lets wait in wgpu's staging buffers ([`Gpu::bound_staging`]).
pub(crate) const STAGING_BOUND: u64 = 16 << 20;

thread_local! {
    /// Bytes of GPU buffers allocated on this thread, through any context.
    static THREAD_ALLOCATED: Cell<u64> = const { Cell::new(0) };
}

/// Runs `f` and returns its result with the bytes of GPU buffers it allocated (on this thread),
/// for the owner of those buffers to give back with [`Gpu::release_allocation`] when it drops
/// them.
pub fn counting_allocations<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let before = THREAD_ALLOCATED.with(Cell::get);
    let out = f();
    (out, THREAD_ALLOCATED.with(Cell::get) - before)
}

/// What the caller asks of the GPU context.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Adapter name substring or index in [`Gpu::list_adapters`] order; `None` picks the best.
    pub adapter: Option<String>,
    /// Pretend the device's largest storage binding is this many bytes (tests force chunking).
    pub max_binding_override: Option<u64>,
    /// Do not use subgroup operations even if the adapter has them (tests the fallback kernels).
    pub disable_subgroups: bool,
    /// Pretend the adapter has this many bytes of memory, all free (tests simulate a small GPU;
    /// also `MOESTREAM_GPU_MEMORY`).
    pub memory_override: Option<u64>,
    /// Time every kernel dispatch (`bench profile`), as `profile_timing` says.
    pub profile: bool,
    /// How to time dispatches when profiling; `None`: the best the adapter offers
    /// ([`ProfileTiming::best`]). One the adapter cannot do is an error.
    pub profile_timing: Option<ProfileTiming>,
    /// Lay kernels out as on a hardware GPU even on a software adapter ([`Caps::cpu_layouts`]
    /// off): tests run the kernels GPUs run on lavapipe.
    pub gpu_layouts: bool,
    /// Lanes per team of the GPU-layout decode kernels (8 or 32, [`Caps::decode_team`]); `None`:
    /// the adapter's pick. Tests run the 32-lane teams on lavapipe with it.
    pub decode_team: Option<u32>,
    /// Prefill dense matrices with the tiled GEMM even on a CPU adapter ([`Caps::tiled_prefill`]):
    /// tests keep it covered on lavapipe.
    pub tiled_prefill: bool,
    /// Build the kernels with all of naga's runtime checks even where the adapter bounds buffer
    /// accesses itself ([`Caps::shader_checks`]): tests compare the two builds.
    pub shader_checks: bool,
    /// Load the CPU layout's 16-byte weight groups as 4-byte words even where the adapter has
    /// 8-byte integers ([`Caps::words64`] off): tests compare the two loads.
    pub four_byte_words: bool,
    /// Keep int4 and f16 matrices row-major even in the CPU layout ([`Caps::weight_tiles`] off): tests
    /// compare the two.
    pub row_major_weights: bool,
    /// Force a decode layout, as `MOESTREAM_DECODE_LAYOUT` does (which wins when set).
    pub decode_layout: Option<LayoutChoice>,
    /// Force how routed experts prefill, as `MOESTREAM_EXPERT_PREFILL` does (which wins when set).
    pub expert_prefill: Option<ExpertPrefill>,
    /// Prefill dense matrices through the decode matvec even on a GPU ([`Caps::tiled_prefill`]
    /// off; `tiled_prefill` wins when both are set).
    pub matvec_prefill: bool,
    /// Run the delta rule token by token in steps of several tokens too
    /// ([`Caps::chunked_delta_rule`] off): tests and `bench` compare the two forms.
    pub sequential_delta_rule: bool,
}

/// Capabilities the kernels adapt to.
#[derive(Clone, Copy, Debug)]
pub struct Caps {
    /// Subgroup operations are available and enabled.
    pub subgroups: bool,
    /// `f16` arithmetic in shaders is available.
    pub shader_f16: bool,
    /// Timestamp queries are available.
    pub timestamps: bool,
    /// Largest storage-buffer binding the kernels may use, in bytes (a multiple of 256).
    pub max_binding: u64,
    /// Largest buffer the device allows, in bytes.
    pub max_buffer: u64,
    /// Storage buffers one shader stage may bind.
    pub max_storage_buffers: u32,
    /// Largest workgroup count along one dimension.
    pub max_workgroups_per_dim: u32,
    /// Kernels take their CPU-adapter layouts (a software adapter such as lavapipe, whose
    /// workgroups are threads and lanes SIMD lanes), unless [`GpuOptions::gpu_layouts`].
    pub cpu_layouts: bool,
    /// Lanes per team of the GPU-layout decode kernels (matvec, expert_gate_up, expert_down; the
    /// `TEAM` of shaders/team.wgsl): 32, a whole subgroup, where subgroups are on and never
    /// smaller than 32 lanes (NVIDIA, AMD, Apple), so a 4096-row matvec runs as 64K lanes rather
    /// than 16K; else 8 (Intel's 8-lane subgroups, no subgroups), summed through shared memory
    /// where subgroups are smaller than the team.
    pub decode_team: u32,
    /// Steps of more than `MATVEC_MAX_TOKENS` tokens run dense matrices through the tiled
    /// `matmul` GEMM (GPUs); else through the decode `matvec`, one token after the other, each
    /// workgroup's rows staying in cache (CPU adapters, where the GEMM's workgroup-memory
    /// staging made the bench model's dense prefill 1.7-2.1x slower in int4 and ggml blocks).
    /// `GpuOptions::tiled_prefill` or `MOESTREAM_DENSE_PREFILL=tiled|matvec` choose instead.
    pub tiled_prefill: bool,
    /// The decode layout `MOESTREAM_DECODE_LAYOUT` forces, if any (read when the context opens).
    pub decode_layout: Option<LayoutChoice>,
    /// How routed experts prefill where `MOESTREAM_EXPERT_PREFILL` says (read when the context
    /// opens).
    pub expert_prefill: Option<ExpertPrefill>,
    /// Steps of several tokens run the gated delta rule in its chunked form
    /// (`ops::gated_delta_rule`), unless [`GpuOptions::sequential_delta_rule`] or
    /// `MOESTREAM_DELTA_RULE=sequential` keep it token by token.
    pub chunked_delta_rule: bool,
    /// Kernels keep naga's bounds and loop checks (see `gpu/shader_checks.rs`): everywhere
    /// except on Vulkan adapters that bound buffer accesses themselves, or with
    /// `MOESTREAM_SHADER_CHECKS=on` / [`GpuOptions::shader_checks`].
    pub shader_checks: bool,
    /// The CPU layout's wide decode kernels (`LANE_WIDE`) load their 16-byte weight groups as two
    /// 8-byte integers rather than four words (`WORDS64`: the adapter has `SHADER_INT64`, not
    /// [`GpuOptions::four_byte_words`] or `MOESTREAM_WORDS64=off`). lavapipe loads a storage
    /// buffer component by component, each a loop over the SIMD lanes, so 8-byte components
    /// halve the loops per weight; the values, and so the results, are the same.
    pub words64: bool,
    /// The CPU layout's int4 (groups of 32) and f16 matrices and expert slots are held in tiles
    /// of 64 rows × 64 columns (`TILES`, [`crate::ops::weight_tiles`]), so each per-lane load loop
    /// reads neighbouring cache lines rather than 8 rows far apart; not with
    /// [`GpuOptions::row_major_weights`] or `MOESTREAM_WEIGHT_TILES=off`. The same values, so the
    /// same results.
    pub weight_tiles: bool,
}

/// A printable description of one adapter.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AdapterReport {
    /// Position in [`Gpu::list_adapters`].
    pub index: usize,
    /// Adapter name as the driver reports it.
    pub name: String,
    /// Vulkan, Metal, Dx12, ...
    pub backend: String,
    /// Discrete, integrated, CPU (software), ...
    pub device_type: String,
    /// Driver name and version.
    pub driver: String,
    /// Whether this is a software rasterizer such as lavapipe.
    pub software: bool,
    /// Optional features moestream uses that the adapter offers.
    pub features: Vec<String>,
    /// How `bench profile` times dispatches on it by default (the best its features allow).
    pub profile_timing: ProfileTiming,
    /// Largest storage-buffer binding in bytes.
    pub max_storage_binding: u64,
    /// Largest buffer in bytes.
    pub max_buffer: u64,
    /// Storage buffers per shader stage.
    pub max_storage_buffers_per_stage: u32,
    /// Workgroup storage in bytes.
    pub max_workgroup_storage: u32,
    /// Memory for buffers and what is free now.
    pub memory: GpuMemory,
    /// Smallest and largest subgroup the adapter may run (0 where it reports none).
    pub subgroup_sizes: [u32; 2],
    /// The driver keeps every buffer access in range itself (Vulkan's `robustBufferAccess`), so
    /// kernels are built without naga's index clamps and loop counters ([`Caps::shader_checks`]).
    pub driver_bounds_buffers: bool,
}

impl AdapterReport {
    /// Lanes per team of the GPU-layout decode kernels with subgroups on or off:
    /// [`Caps::decode_team`].
    pub fn decode_team(&self, subgroups: bool) -> u32 {
        if subgroups && self.subgroup_sizes[0] >= 32 {
            32
        } else {
            8
        }
    }
}

/// An open GPU device with its queue, capabilities and pipeline cache.
pub struct Gpu {
    /// The logical device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// What the kernels may use.
    pub caps: Caps,
    /// The adapter in use.
    pub adapter: AdapterReport,
    pub(crate) pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    allocated: AtomicU64,
    /// Bytes queued for upload through wgpu's staging buffers since they were last flushed
    /// ([`Gpu::bound_staging`]).
    staged: AtomicU64,
    /// Times the host has waited for the GPU ([`Gpu::wait_for`]).
    waits: AtomicU64,
    /// The first error wgpu raised outside an error scope (its default handler would panic).
    uncaptured: Arc<Mutex<Option<String>>>,
    /// Per-dispatch timing, when asked for.
    pub(crate) profiler: Option<Arc<Profiler>>,
    /// Objects created so far ([`Gpu::objects_created`]).
    pub(crate) objects: ObjectCounters,
}

fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    if wgpu::Backends::from_env().is_none() {
        desc.backends = wgpu::Backends::PRIMARY;
    }
    wgpu::Instance::new(desc)
}

fn report(index: usize, adapter: &wgpu::Adapter) -> AdapterReport {
    let info = adapter.get_info();
    let features = adapter.features();
    let limits = adapter.limits();
    let mut names = Vec::new();
    for (flag, name) in [
        (wgpu::Features::SUBGROUP, "SUBGROUP"),
        (wgpu::Features::SHADER_F16, "SHADER_F16"),
        (wgpu::Features::TIMESTAMP_QUERY, "TIMESTAMP_QUERY"),
        (wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES, "TIMESTAMP_QUERY_INSIDE_PASSES"),
        (wgpu::Features::SHADER_INT64, "SHADER_INT64"),
    ] {
        if features.contains(flag) {
            names.push(name.to_string());
        }
    }
    AdapterReport {
        index,
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
        software: info.device_type == wgpu::DeviceType::Cpu,
        features: names,
        profile_timing: ProfileTiming::best(features),
        max_storage_binding: limits.max_storage_buffer_binding_size,
        max_buffer: limits.max_buffer_size,
        max_storage_buffers_per_stage: limits.max_storage_buffers_per_shader_stage,
        max_workgroup_storage: limits.max_compute_workgroup_storage_size,
        memory: match GpuMemory::env_override() {
            Ok(Some(bytes)) => GpuMemory::simulated(bytes),
            _ => GpuMemory::discover(adapter),
        },
        subgroup_sizes: [info.subgroup_min_size, info.subgroup_max_size],
        driver_bounds_buffers: shader_checks::bounds_buffer_accesses(adapter),
    }
}

fn sorted_adapters() -> Vec<wgpu::Adapter> {
    let mut adapters = pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()));
    adapters.sort_by_key(|a| adapter_choice::preference(&a.get_info()));
    adapters
}

impl Gpu {
    /// Lists every adapter, best first, as `moestream devices` prints them.
    pub fn list_adapters() -> Vec<AdapterReport> {
        sorted_adapters().iter().enumerate().map(|(i, a)| report(i, a)).collect()
    }

    /// Opens the chosen adapter (see [`GpuOptions`]; the best by the rule of [`adapter_choice`]
    /// unless named) with every optional feature it offers; a DX12 adapter that cannot be opened
    /// falls back to a Vulkan one with a warning.
    pub fn new(options: &GpuOptions) -> Result<Arc<Gpu>> {
        let adapters = sorted_adapters();
        if adapters.is_empty() {
            return Err(Error::Adapter(
                "no GPU adapter found (install a Vulkan driver, e.g. mesa-vulkan-drivers)".into(),
            ));
        }
        let wanted = options.adapter.clone().or_else(|| std::env::var("MOESTREAM_ADAPTER").ok());
        let index = match wanted.as_deref() {
            None => 0,
            Some(w) => match w.parse::<usize>() {
                Ok(i) if i < adapters.len() => i,
                Ok(i) => {
                    return Err(Error::Adapter(format!("adapter index {i} out of range (have {})", adapters.len())))
                }
                Err(_) => adapters
                    .iter()
                    .position(|a| a.get_info().name.to_lowercase().contains(&w.to_lowercase()))
                    .ok_or_else(|| Error::Adapter(format!("no adapter named like {w:?}")))?,
            },
        };
        match Self::open(&adapters[index], index, options) {
            Err(e) => {
                let infos: Vec<_> = adapters.iter().map(|a| a.get_info()).collect();
                let Some(fallback) = adapter_choice::vulkan_fallback(&infos, index) else { return Err(e) };
                log::warn!("{e}; falling back to [{fallback}] {} (Vulkan)", infos[fallback].name);
                Self::open(&adapters[fallback], fallback, options)
            }
            opened => opened,
        }
    }

    /// Where a model that failed to load on this adapter with `error` loads again: `options`
    /// with a Vulkan adapter, where this one is DX12 and `error` is a kernel that failed to build
    /// (a shader compiler's error); else `None` ([`adapter_choice`]).
    pub fn fallback_for(&self, error: &Error, options: &GpuOptions) -> Option<GpuOptions> {
        let Error::Gpu(message) = error else { return None };
        if !adapter_choice::is_kernel_build_failure(message) {
            return None;
        }
        let infos: Vec<_> = sorted_adapters().iter().map(|a| a.get_info()).collect();
        let fallback = adapter_choice::vulkan_fallback(&infos, self.adapter.index)?;
        Some(GpuOptions { adapter: Some(fallback.to_string()), ..options.clone() })
    }

    /// Opens `adapter`, position `index` in [`Gpu::list_adapters`], as [`Gpu::new`] says.
    fn open(adapter: &wgpu::Adapter, index: usize, options: &GpuOptions) -> Result<Arc<Gpu>> {
        let mut report = report(index, adapter);
        GpuMemory::env_override().map_err(Error::InvalidArgument)?;
        if let Some(bytes) = options.memory_override {
            report.memory = GpuMemory::simulated(bytes);
        }
        let offered = adapter.features();
        let mut wanted_features = wgpu::Features::SUBGROUP
            | wgpu::Features::SHADER_F16
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::SHADER_INT64;
        let profile_timing = options.profile.then(|| options.profile_timing.unwrap_or(ProfileTiming::best(offered)));
        if let Some(timing) = profile_timing {
            if !offered.contains(timing.features()) {
                return Err(Error::Adapter(format!(
                    "{} lacks {:?}, which profiling with --timing {} needs; {} is the best it offers",
                    report.name,
                    timing.features() - offered,
                    timing.name(),
                    ProfileTiming::best(offered).name()
                )));
            }
            wanted_features |= timing.features();
        }
        let required_features = offered & wanted_features;
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("moestream"),
            required_features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            // A software adapter's "device" memory is host memory, which wgpu's large blocks
            // (64-128 MiB for staging, 128-256 MiB for buffers) hold touched once used:
            // smaller ones keep its resident set near what the buffers need.
            memory_hints: match report.software {
                true => wgpu::MemoryHints::MemoryUsage,
                false => wgpu::MemoryHints::Performance,
            },
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::Adapter(format!("could not open {}: {e}", report.name)))?;
        let device_binding = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        let max_binding = options.max_binding_override.map_or(device_binding, |o| o.min(device_binding)) & !255;
        let subgroups = required_features.contains(wgpu::Features::SUBGROUP) && !options.disable_subgroups;
        let decode_team = match options.decode_team {
            Some(t @ (8 | 32)) => t,
            Some(t) => return Err(Error::InvalidArgument(format!("a decode team has 8 or 32 lanes, not {t}"))),
            None => report.decode_team(subgroups),
        };
        let cpu_layouts = report.software && !options.gpu_layouts;
        let caps = Caps {
            subgroups,
            shader_f16: required_features.contains(wgpu::Features::SHADER_F16),
            timestamps: required_features.contains(wgpu::Features::TIMESTAMP_QUERY),
            max_binding,
            max_buffer: limits.max_buffer_size,
            max_storage_buffers: limits.max_storage_buffers_per_shader_stage,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
            cpu_layouts,
            decode_team,
            tiled_prefill: env_choice("MOESTREAM_DENSE_PREFILL", &[("tiled", true), ("matvec", false)])?
                .unwrap_or(options.tiled_prefill || (!cpu_layouts && !options.matvec_prefill)),
            decode_layout: LayoutChoice::from_env()?.or(options.decode_layout),
            expert_prefill: ExpertPrefill::from_env()?.or(options.expert_prefill),
            chunked_delta_rule: env_choice("MOESTREAM_DELTA_RULE", &[("chunked", true), ("sequential", false)])?
                .unwrap_or(!options.sequential_delta_rule),
            shader_checks: shader_checks::keep_checks(report.driver_bounds_buffers, options.shader_checks)?,
            words64: cpu_layouts
                && required_features.contains(wgpu::Features::SHADER_INT64)
                && !options.four_byte_words
                && env_choice("MOESTREAM_WORDS64", &[("auto", true), ("off", false)])?.unwrap_or(true),
            weight_tiles: cpu_layouts
                && !options.row_major_weights
                && env_choice("MOESTREAM_WEIGHT_TILES", &[("auto", true), ("off", false)])?.unwrap_or(true),
        };
        log::info!("GPU: {} ({}, {}), caps {:?}", report.name, report.backend, report.device_type, caps);
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("GPU error: {e}");
            sink.lock().expect("GPU error sink").get_or_insert_with(|| e.to_string());
        }));
        Ok(Arc::new(Gpu {
            caps,
            adapter: report,
            pipelines: Mutex::new(HashMap::new()),
            allocated: AtomicU64::new(0),
            staged: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            uncaptured,
            profiler: profile_timing.map(|timing| Arc::new(Profiler::new(&device, &queue, timing))),
            objects: ObjectCounters::default(),
            device,
            queue,
        }))
    }

    /// The per-dispatch profiler, when the context was opened with [`GpuOptions::profile`].
    pub fn profiler(&self) -> Option<&Profiler> {
        self.profiler.as_deref()
    }

    /// The adapter's memory as discovered when it was opened (or simulated).
    pub fn memory(&self) -> GpuMemory {
        self.adapter.memory
    }

    /// Bytes of GPU buffers allocated through this context and not yet given back: models and
    /// sequence caches give theirs back when dropped ([`Gpu::release_allocation`]), so a model
    /// loaded after others were dropped on the same context plans with the memory they held.
    pub fn bytes_allocated(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// Pipelines, shader modules, bind groups and buffers this context has created so far.
    pub fn objects_created(&self) -> ObjectCounts {
        self.objects.snapshot()
    }

    pub(crate) fn count_allocation(&self, bytes: u64) {
        self.objects.created(Object::Buffer);
        self.allocated.fetch_add(bytes, Ordering::Relaxed);
        THREAD_ALLOCATED.with(|c| c.set(c.get() + bytes));
    }

    /// Gives back `bytes` of buffers their owner has dropped (measured with
    /// [`counting_allocations`]).
    pub fn release_allocation(&self, bytes: u64) {
        let _ = self.allocated.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |a| Some(a.saturating_sub(bytes)));
    }

    /// Counts `bytes` just queued for upload (`create_buffer_init`, `queue.write_buffer`): wgpu
    /// copies them into a staging buffer it frees only once a submission carrying them has
    /// finished, and a model's load submits nothing, so every weight would sit in memory twice
    /// until the first step (on lavapipe both copies are host memory). Past [`STAGING_BOUND`]
    /// bytes the queued uploads are submitted and waited for, which frees their staging.
    pub(crate) fn bound_staging(&self, bytes: u64) {
        if self.staged.fetch_add(bytes, Ordering::Relaxed) + bytes > STAGING_BOUND {
            self.staged.store(0, Ordering::Relaxed);
            self.queue.submit(std::iter::empty());
            // A lost device is reported by the next wait that needs the GPU.
            let _ = self.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None });
        }
    }

    /// Blocks until all submitted work has finished; reports a lost device, or an error wgpu
    /// raised since the context was opened, as an error.
    pub fn wait(&self) -> Result<()> {
        self.wait_for(None)
    }

    /// How many times the host has waited for the GPU so far (each a round trip a GPU sits
    /// idle through).
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// [`Gpu::wait`] for `submission` only (and what was submitted before it), or for all
    /// submitted work with `None`: later submissions may still be running when it returns.
    pub fn wait_for(&self, submission: Option<wgpu::SubmissionIndex>) -> Result<()> {
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.device
            .poll(wgpu::PollType::Wait { submission_index: submission, timeout: None })
            .map_err(|e| Error::Gpu(format!("device poll failed: {e}")))?;
        match self.uncaptured.lock().expect("GPU error sink").clone() {
            Some(message) => Err(Error::Gpu(message)),
            None => Ok(()),
        }
    }

    /// Runs `build`, which allocates GPU buffers, and turns an allocation the driver refuses
    /// into [`Error::OutOfGpuMemory`] (a buffer over the device's limits into [`Error::Gpu`])
    /// instead of a later failure, leaving the context usable.
    pub fn catch_out_of_memory<T>(&self, build: impl FnOnce() -> Result<T>) -> Result<T> {
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        // Validation errors (a buffer over the device's maximum) are caught too: left to the
        // uncaptured handler they would fail every later wait on this context.
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let built = build();
        let invalid = pollster::block_on(validation.pop());
        match (pollster::block_on(scope.pop()), invalid, built) {
            (Some(e), _, _) => Err(Error::OutOfGpuMemory {
                allocated: self.bytes_allocated(),
                available: self.adapter.memory.available,
                message: e.to_string(),
            }),
            // The build's own error says more than the validation error it left behind.
            (None, _, Err(e)) => Err(e),
            (None, Some(e), Ok(_)) => Err(Error::Gpu(e.to_string())),
            (None, None, built) => built,
        }
    }
}
