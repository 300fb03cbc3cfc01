//! The bigger-than-memory benchmark: decode with experts streamed from the expert store on
//! disk, for every I/O thread count × eviction policy × prefetcher, against the device's own
//! sequential and 4 KiB random read bandwidth ([`super::device_read`]).
//!
//! No resident baseline runs (the point is a model whose experts do not fit); instead every
//! configuration must generate the same tokens as the first one, and `tests/` checks streamed
//! against resident on small models. Each configuration gets a fresh engine and starts with
//! the store dropped from the page cache. The prompt is prefilled with one generated token
//! first; the figures are those of the decode steps after it (every one a one-token step).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::device_read::{self, DeviceBandwidth};
use super::workload::random_tokens;
use crate::convert::EXPERTS_FILE;
use crate::error::{Error, Result};
use crate::experts::policy::PolicyKind;
use crate::experts::predictor::PrefetchKind;
use crate::gpu::Gpu;
use crate::runtime::{heap_trim, Engine, EngineOptions, GenerateOptions};

/// What to run.
#[derive(Clone, Debug)]
pub struct SsdBenchOptions {
    /// A converted model directory (with `experts.bin`), its budget and I/O settings; the I/O
    /// threads, policy and prefetcher are overridden.
    pub base: EngineOptions,
    /// Reader thread counts.
    pub io_threads: Vec<usize>,
    /// Eviction policies.
    pub policies: Vec<PolicyKind>,
    /// Prefetchers.
    pub prefetch: Vec<PrefetchKind>,
    /// Prompt tokens (seeded random ids).
    pub prompt_tokens: usize,
    /// Tokens decoded after the prompt (greedy, end-of-sequence ignored).
    pub decode_tokens: usize,
    /// Seed of the prompt.
    pub seed: u64,
    /// Seconds of each device-bandwidth pattern.
    pub device_seconds: f64,
}

/// One configuration's decode figures.
#[derive(Clone, Debug, Serialize)]
pub struct SsdRun {
    /// Reader threads.
    pub io_threads: usize,
    /// Eviction policy.
    pub policy: String,
    /// Prefetcher.
    pub prefetch: String,
    /// Every generated token (the prompt's one, then the decoded ones), so that configurations
    /// run in separate processes can be checked against each other.
    pub tokens: Vec<u32>,
    /// Decode tokens per second (wall time of the decode steps).
    pub decode_tokens_per_s: f64,
    /// Needs found in a slot over needs.
    pub hit_rate: f64,
    /// Milliseconds per token the GPU pipeline waited for expert data.
    pub stall_ms_per_token: f64,
    /// Milliseconds per token during which an expert read was in flight.
    pub io_busy_ms_per_token: f64,
    /// `1 - stall / io_busy`: the share of expert-load time hidden behind compute.
    pub hidden_share: f64,
    /// Bytes read from the store per token.
    pub bytes_read_per_token: f64,
    /// The needed experts' own bytes per token (misses + prefetches used).
    pub needed_bytes_per_token: f64,
    /// `bytes_read / needed_bytes`: 1 is no read amplification.
    pub read_amplification: f64,
    /// Bytes read over the time reads were in flight, MB/s.
    pub read_mb_s: f64,
    /// `read_mb_s` over the device's sequential bandwidth.
    pub vs_sequential: f64,
    /// `read_mb_s` over the device's 4 KiB random bandwidth.
    pub vs_random_4k: f64,
    /// Milliseconds per token copying read experts into their GPU slots.
    pub upload_ms_per_token: f64,
    /// CPU milliseconds per token the reader threads spent in reads.
    pub io_cpu_ms_per_token: f64,
    /// That CPU time over the whole process's CPU time while decoding.
    pub io_cpu_share: f64,
}

/// The benchmark's results.
#[derive(Clone, Debug, Serialize)]
pub struct SsdReport {
    /// Adapter name.
    pub adapter: String,
    /// Model directory.
    pub model: String,
    /// Bytes of `experts.bin`.
    pub store_bytes: u64,
    /// Expert slots on the GPU.
    pub slots: usize,
    /// Routed experts in all layers.
    pub total_experts: usize,
    /// `uncached (O_DIRECT)` or `buffered`, and why.
    pub io_mode: String,
    /// Host copies of each expert's bytes: page cache → staging (buffered only), staging →
    /// the GPU upload.
    pub host_copies_per_read: u32,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens decoded per configuration.
    pub decode_tokens: usize,
    /// The device's own bandwidth.
    pub device: DeviceBandwidth,
    /// Every configuration, in run order.
    pub runs: Vec<SsdRun>,
}

/// Runs the benchmark, calling `progress` after each configuration.
pub fn run(o: &SsdBenchOptions, mut progress: impl FnMut(&SsdRun)) -> Result<SsdReport> {
    if o.prompt_tokens == 0 || o.decode_tokens == 0 {
        return Err(Error::InvalidArgument("bench ssd needs prompt and decode tokens > 0".into()));
    }
    if o.io_threads.is_empty() || o.policies.is_empty() || o.prefetch.is_empty() {
        return Err(Error::InvalidArgument("bench ssd needs at least one thread count, policy and prefetcher".into()));
    }
    let store = o.base.model_dir.join(EXPERTS_FILE);
    let store_bytes = std::fs::metadata(&store)
        .map_err(|_| {
            Error::InvalidArgument(format!(
                "{} has no {EXPERTS_FILE}: bench ssd runs a converted model (moestream convert)",
                o.base.model_dir.display()
            ))
        })?
        .len();
    let (direct, why) = o.base.direct_io.resolve(store_bytes);
    let device = device_read::measure(&store, o.device_seconds, o.io_threads.iter().copied().max().unwrap_or(1))?;
    let gpu = Gpu::new(&o.base.gpu)?;
    let mut first: Option<Vec<u32>> = None;
    let (mut slots, mut total) = (0, 0);
    let mut runs = Vec::new();
    for &threads in &o.io_threads {
        for &policy in &o.policies {
            for &prefetch in &o.prefetch {
                drop_from_page_cache(&store);
                let options = EngineOptions { io_threads: threads, policy, prefetch, ..o.base.clone() };
                let engine = Engine::load_on(Arc::clone(&gpu), &options)?;
                let spec = engine.spec();
                total = spec.moe.as_ref().map_or(0, |m| m.num_experts) * spec.moe_layers.iter().filter(|x| **x).count();
                slots = engine.expert_slots().ok_or_else(|| {
                    Error::InvalidArgument("bench ssd: every expert fits the budget, nothing streams".into())
                })?;
                let (tokens, run) = decode(&engine, o, &device)?;
                let run = SsdRun {
                    io_threads: threads,
                    policy: policy.name().into(),
                    prefetch: prefetch.name().into(),
                    tokens: tokens.clone(),
                    ..run
                };
                match &first {
                    None => first = Some(tokens),
                    Some(want) if *want != tokens => {
                        return Err(Error::Gpu(format!(
                            "bench ssd: {threads} I/O threads, policy {policy}, prefetch {prefetch} generated other \
                             tokens than the first configuration; streaming must be exact"
                        )))
                    }
                    Some(_) => {}
                }
                progress(&run);
                runs.push(run);
                // wgpu frees a dropped engine's buffers only at its next maintenance: without
                // this wait the next engine would load beside them (twice the memory, which a
                // memory bound turns into a kill). The engine trimmed the heap as it dropped,
                // before that; what the wait freed is given back here.
                drop(engine);
                gpu.wait()?;
                heap_trim::trim();
            }
        }
    }
    Ok(SsdReport {
        adapter: gpu.adapter.name.clone(),
        model: o.base.model_dir.display().to_string(),
        store_bytes,
        slots,
        total_experts: total,
        io_mode: format!("{} ({why})", if direct { "uncached (O_DIRECT)" } else { "buffered" }),
        host_copies_per_read: if direct { 1 } else { 2 },
        prompt_tokens: o.prompt_tokens,
        decode_tokens: o.decode_tokens,
        device,
        runs,
    })
}

/// Prefills the prompt (one token generated), then decodes and measures; returns every
/// generated token and the figures (policy and prefetcher names left empty).
fn decode(engine: &Engine, o: &SsdBenchOptions, device: &DeviceBandwidth) -> Result<(Vec<u32>, SsdRun)> {
    let prompt = random_tokens(o.prompt_tokens, engine.spec().vocab, o.seed);
    let mut session = engine.new_session()?;
    let one = GenerateOptions { max_tokens: 1, ignore_eos: true, ..Default::default() };
    let mut tokens = engine.generate_in(&mut session, &prompt, &one, |_, _| true)?.tokens;
    let before = engine.expert_stats();
    let (started, cpu_before) = (Instant::now(), process_cpu_time());
    let rest = GenerateOptions { max_tokens: o.decode_tokens, ignore_eos: true, ..Default::default() };
    let generated = engine.generate_in(&mut session, &[], &rest, |_, _| true)?.tokens;
    let (wall, cpu) = (started.elapsed().as_secs_f64(), process_cpu_time().saturating_sub(cpu_before));
    let s = engine.expert_stats().since(&before);
    let n = generated.len().max(1) as f64;
    tokens.extend(generated);
    let read_mb_s = s.bytes_read as f64 / (s.io_busy_ms / 1e3).max(1e-9) / 1e6;
    let run = SsdRun {
        io_threads: 0,
        policy: String::new(),
        prefetch: String::new(),
        tokens: Vec::new(),
        decode_tokens_per_s: n / wall.max(1e-9),
        hit_rate: s.hit_rate,
        stall_ms_per_token: s.stall_ms / n,
        io_busy_ms_per_token: s.io_busy_ms / n,
        hidden_share: if s.io_busy_ms > 0.0 { (1.0 - s.stall_ms / s.io_busy_ms).clamp(0.0, 1.0) } else { 1.0 },
        bytes_read_per_token: s.bytes_read as f64 / n,
        needed_bytes_per_token: s.needed_bytes as f64 / n,
        read_amplification: s.bytes_read as f64 / (s.needed_bytes as f64).max(1.0),
        read_mb_s,
        vs_sequential: read_mb_s / device.sequential_mb_s.max(1e-9),
        vs_random_4k: read_mb_s / device.random_4k_mb_s.max(1e-9),
        upload_ms_per_token: s.upload_ms / n,
        io_cpu_ms_per_token: s.io_cpu_ms / n,
        io_cpu_share: s.io_cpu_ms / (cpu.as_secs_f64() * 1e3).max(1e-9),
    };
    Ok((tokens, run))
}

/// Asks the OS to drop `path`'s cached pages, so every configuration starts cold (Linux; a
/// no-op elsewhere and for pages mapped by another process).
fn drop_from_page_cache(path: &Path) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Ok(f) = std::fs::File::open(path) {
        use std::os::fd::AsRawFd;
        // SAFETY: advice on a descriptor this function owns; no memory is passed.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = path;
}

/// CPU time of the whole process (user + system); zero where unavailable.
fn process_cpu_time() -> Duration {
    #[cfg(unix)]
    {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec through a valid pointer.
        if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) } == 0 {
            return Duration::new(t.tv_sec as u64, t.tv_nsec as u32);
        }
    }
    Duration::ZERO
}

impl SsdReport {
    /// A markdown table of the runs (for a README).
    pub fn markdown(&self) -> String {
        let mut s = String::from(
            "| I/O threads | policy | prefetch | decode tok/s | hit rate | stall ms/tok | hidden | MiB read/tok | \
             needed MiB/tok | amplification | read MB/s | vs seq | vs 4K rand | I/O CPU ms/tok | I/O CPU share | upload ms/tok |\n\
             |---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        let mib = |b: f64| b / 1048576.0;
        for r in &self.runs {
            s += &format!(
                "| {} | {} | {} | {:.2} | {:.1}% | {:.0} | {:.0}% | {:.1} | {:.1} | {:.2} | {:.0} | {:.2} | {:.2} | {:.1} | {:.1}% | {:.1} |\n",
                r.io_threads,
                r.policy,
                r.prefetch,
                r.decode_tokens_per_s,
                r.hit_rate * 100.0,
                r.stall_ms_per_token,
                r.hidden_share * 100.0,
                mib(r.bytes_read_per_token),
                mib(r.needed_bytes_per_token),
                r.read_amplification,
                r.read_mb_s,
                r.vs_sequential,
                r.vs_random_4k,
                r.io_cpu_ms_per_token,
                r.io_cpu_share * 100.0,
                r.upload_ms_per_token
            );
        }
        s
    }
}
