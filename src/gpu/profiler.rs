//! Per-kernel GPU time from timestamp queries written around every dispatch.
//!
//! When [`super::GpuOptions::profile`] is set and the adapter offers
//! `TIMESTAMP_QUERY_INSIDE_PASSES`, every [`super::Kernel`] dispatch is bracketed by two
//! timestamps. [`Profiler::end_step`] (called by the decoder after each step) resolves them and
//! adds each dispatch's time and bytes to the totals of its kernel, and its time to the totals
//! of the step's section it was recorded in ([`Profiler::set_section`]: attention of each kind,
//! FFN, head), kept apart for one-token (decode) steps and longer (prefill) steps.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use super::{Gpu, Readback};
use crate::error::Result;

/// Timestamps one step may hold (two per dispatch); later dispatches of the step go untimed and
/// are counted in [`StepKindProfile::untimed_dispatches`].
const MAX_QUERIES: u32 = 4096;

/// Bytes a dispatch moves, as its launcher models them: `fixed` (weights) plus `per_token` for
/// each token of the step plus `per_position` for each cache position it reads (`pos + n`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes read or written whatever the step.
    pub fixed: u64,
    /// Bytes per token of the step.
    pub per_token: u64,
    /// Bytes per cached position read (attention).
    pub per_position: u64,
}

impl Traffic {
    /// Bytes of one dispatch in a step of `n_tokens` tokens ending at cache length `kv_len`.
    pub fn bytes(&self, n_tokens: u64, kv_len: u64) -> u64 {
        self.fixed + self.per_token * n_tokens + self.per_position * kv_len
    }
}

/// One kernel's totals over the profiled steps of one kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KernelProfile {
    /// Shader name.
    pub kernel: String,
    /// Dispatches timed.
    pub dispatches: u64,
    /// GPU time, milliseconds.
    pub ms: f64,
    /// Share of the step's timed GPU time.
    pub share: f64,
    /// Bytes moved, as the launchers model them (0 where a kernel's traffic is not modelled).
    pub bytes: u64,
    /// Achieved bandwidth, GB/s (`bytes / time`).
    pub gbps: f64,
}

/// One section's totals (the part of the step its dispatches were recorded in, e.g. every
/// linear-attention layer's attention part) over the profiled steps of one kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SectionProfile {
    /// Section name, as the decoder sets it.
    pub section: String,
    /// Dispatches timed.
    pub dispatches: u64,
    /// GPU time, milliseconds.
    pub ms: f64,
    /// Share of the step's timed GPU time.
    pub share: f64,
}

/// Totals over the profiled steps of one kind (decode or prefill).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepKindProfile {
    /// Steps profiled.
    pub steps: u64,
    /// Tokens in those steps.
    pub tokens: u64,
    /// Sum of the timed dispatches, milliseconds.
    pub gpu_ms: f64,
    /// Per kernel, slowest first.
    pub kernels: Vec<KernelProfile>,
    /// Per section, slowest first.
    pub sections: Vec<SectionProfile>,
    /// Dispatches past the per-step query capacity, not timed.
    pub untimed_dispatches: u64,
}

struct Pending {
    labels: Vec<(&'static str, &'static str, Traffic)>,
    section: &'static str,
    dropped: u64,
}

/// The section of dispatches recorded before any [`Profiler::set_section`] of the step.
const NO_SECTION: &str = "other";

#[derive(Default)]
struct Totals {
    steps: u64,
    tokens: u64,
    untimed: u64,
    kernels: BTreeMap<&'static str, (u64, f64, u64)>,
    sections: BTreeMap<&'static str, (u64, f64)>,
}

/// The query set and the running totals.
pub struct Profiler {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: Readback,
    period_ns: f64,
    pending: Mutex<Pending>,
    decode: Mutex<Totals>,
    prefill: Mutex<Totals>,
}

impl Profiler {
    /// A profiler on `device` (which must have `TIMESTAMP_QUERY_INSIDE_PASSES`).
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Profiler {
        let bytes = MAX_QUERIES as u64 * 8;
        Profiler {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profiler"),
                ty: wgpu::QueryType::Timestamp,
                count: MAX_QUERIES,
            }),
            resolve: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("profiler resolve"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: Readback::on_device(device, bytes),
            period_ns: queue.get_timestamp_period() as f64,
            pending: Mutex::new(Pending { labels: Vec::new(), section: NO_SECTION, dropped: 0 }),
            decode: Mutex::new(Totals::default()),
            prefill: Mutex::new(Totals::default()),
        }
    }

    /// Records `dispatch` between two timestamps labelled `kernel`.
    pub(crate) fn bracket(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        kernel: &'static str,
        traffic: Traffic,
        dispatch: impl FnOnce(&mut wgpu::ComputePass<'_>),
    ) {
        let mut pending = self.pending.lock().expect("profiler lock");
        let index = pending.labels.len() as u32 * 2;
        if index + 2 > MAX_QUERIES {
            pending.dropped += 1;
            dispatch(pass);
            return;
        }
        let section = pending.section;
        pending.labels.push((kernel, section, traffic));
        pass.write_timestamp(&self.queries, index);
        dispatch(pass);
        pass.write_timestamp(&self.queries, index + 1);
    }

    /// Files the dispatches recorded from now on (until the next call or the step's end) under
    /// `section`.
    pub fn set_section(&self, section: &'static str) {
        self.pending.lock().expect("profiler lock").section = section;
    }

    /// Resolves the step's timestamps (after its work was submitted) and adds them to the
    /// decode totals (`n_tokens == 1`) or the prefill totals.
    pub fn end_step(&self, gpu: &Gpu, n_tokens: usize, kv_len: usize) -> Result<()> {
        let Pending { labels, dropped, .. } = std::mem::replace(
            &mut *self.pending.lock().expect("profiler lock"),
            Pending { labels: Vec::new(), section: NO_SECTION, dropped: 0 },
        );
        let count = labels.len() as u32 * 2;
        let mut ticks = vec![0u64; count as usize];
        if count > 0 {
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            encoder.resolve_query_set(&self.queries, 0..count, &self.resolve, 0);
            gpu.queue.submit([encoder.finish()]);
            self.readback.read(gpu, &self.resolve, 0, bytemuck::cast_slice_mut(&mut ticks))?;
        }
        let mut totals = if n_tokens == 1 { &self.decode } else { &self.prefill }.lock().expect("profiler lock");
        totals.steps += 1;
        totals.tokens += n_tokens as u64;
        totals.untimed += dropped;
        for (i, (kernel, section, traffic)) in labels.iter().enumerate() {
            let ms = ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * self.period_ns / 1e6;
            let entry = totals.kernels.entry(kernel).or_default();
            entry.0 += 1;
            entry.1 += ms;
            entry.2 += traffic.bytes(n_tokens as u64, kv_len as u64);
            let entry = totals.sections.entry(section).or_default();
            entry.0 += 1;
            entry.1 += ms;
        }
        Ok(())
    }

    /// Totals of the decode steps and of the prefill steps so far.
    pub fn report(&self) -> (StepKindProfile, StepKindProfile) {
        (
            summarise(&self.decode.lock().expect("profiler lock")),
            summarise(&self.prefill.lock().expect("profiler lock")),
        )
    }

    /// Forgets the totals (e.g. after a warm-up).
    pub fn reset(&self) {
        *self.decode.lock().expect("profiler lock") = Totals::default();
        *self.prefill.lock().expect("profiler lock") = Totals::default();
    }
}

fn summarise(t: &Totals) -> StepKindProfile {
    let gpu_ms: f64 = t.kernels.values().map(|k| k.1).sum();
    let share = |ms: f64| if gpu_ms > 0.0 { ms / gpu_ms } else { 0.0 };
    let mut kernels: Vec<KernelProfile> = t
        .kernels
        .iter()
        .map(|(name, &(dispatches, ms, bytes))| KernelProfile {
            kernel: name.to_string(),
            dispatches,
            ms,
            share: share(ms),
            bytes,
            gbps: if ms > 0.0 { bytes as f64 / (ms * 1e6) } else { 0.0 },
        })
        .collect();
    kernels.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    let mut sections: Vec<SectionProfile> = t
        .sections
        .iter()
        .map(|(name, &(dispatches, ms))| SectionProfile { section: name.to_string(), dispatches, ms, share: share(ms) })
        .collect();
    sections.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    StepKindProfile { steps: t.steps, tokens: t.tokens, gpu_ms, kernels, sections, untimed_dispatches: t.untimed }
}
