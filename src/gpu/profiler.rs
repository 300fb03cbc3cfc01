//! Per-kernel GPU time of every dispatch.
//!
//! When [`super::GpuOptions::profile`] is set, every [`super::Kernel`] dispatch is timed in the
//! best way the adapter offers ([`ProfileTiming`]): two timestamps around it inside the pass,
//! else a compute pass of its own with timestamps at its boundaries (Apple GPUs on Metal have
//! no timestamps inside passes), else a submission of its own timed by the host clock.
//! [`Profiler::end_step`] (called by the decoder after each step) resolves them and
//! adds each dispatch's time and bytes to the totals of its kernel, and its time to the totals
//! of the step's section it was recorded in ([`Profiler::set_section`]: attention of each kind,
//! FFN, head), kept apart for one-token (decode) steps and longer (prefill) steps.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use super::{Gpu, Pass, Readback};
use crate::error::Result;

/// How each dispatch is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProfileTiming {
    /// Timestamps written inside the compute pass before and after the dispatch
    /// (`TIMESTAMP_QUERY_INSIDE_PASSES`); the step's dispatches stay in one pass.
    InsidePasses,
    /// The dispatch in a compute pass of its own, timestamps at the pass's beginning and end
    /// (`TIMESTAMP_QUERY` only, e.g. Apple GPUs on Metal).
    PassBoundaries,
    /// The dispatch in a submission of its own, the queue drained before it, timed by the host
    /// clock from submit to completion (no timestamp queries): includes each submission's cost.
    Submits,
}

impl ProfileTiming {
    /// Every timing, best first.
    pub const ALL: [ProfileTiming; 3] =
        [ProfileTiming::InsidePasses, ProfileTiming::PassBoundaries, ProfileTiming::Submits];

    /// The device features this timing needs.
    pub fn features(self) -> wgpu::Features {
        match self {
            ProfileTiming::InsidePasses => {
                wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            }
            ProfileTiming::PassBoundaries => wgpu::Features::TIMESTAMP_QUERY,
            ProfileTiming::Submits => wgpu::Features::empty(),
        }
    }

    /// The best timing an adapter offering `features` supports.
    pub fn best(features: wgpu::Features) -> ProfileTiming {
        Self::ALL.into_iter().find(|t| features.contains(t.features())).unwrap_or(ProfileTiming::Submits)
    }

    /// The name `bench profile --timing` takes and reports.
    pub fn name(self) -> &'static str {
        match self {
            ProfileTiming::InsidePasses => "inside-passes",
            ProfileTiming::PassBoundaries => "pass-boundaries",
            ProfileTiming::Submits => "submits",
        }
    }

    /// The timing named `name` (see [`ProfileTiming::name`]).
    pub fn parse(name: &str) -> std::result::Result<ProfileTiming, String> {
        Self::ALL.into_iter().find(|t| t.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|t| t.name()).collect();
            format!("unknown profile timing {name:?} (one of: {})", names.join(", "))
        })
    }
}

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

/// One timed dispatch of the step: kernel, section, traffic, and its host-clock time in
/// milliseconds under [`ProfileTiming::Submits`] (else its two timestamps are queries
/// `2i, 2i + 1`).
type Timed = (&'static str, &'static str, Traffic, Option<f64>);

struct Pending {
    labels: Vec<Timed>,
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

/// The timestamp queries of one step and where they are resolved to.
struct Queries {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: Readback,
    period_ns: f64,
}

/// The timing, its queries (for the timestamp timings) and the running totals.
pub struct Profiler {
    timing: ProfileTiming,
    queries: Option<Queries>,
    device: wgpu::Device,
    queue: wgpu::Queue,
    pending: Mutex<Pending>,
    decode: Mutex<Totals>,
    prefill: Mutex<Totals>,
}

impl Profiler {
    /// A profiler on `device`, which must have `timing`'s features.
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue, timing: ProfileTiming) -> Profiler {
        let bytes = MAX_QUERIES as u64 * 8;
        let queries = (timing != ProfileTiming::Submits).then(|| Queries {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
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
        });
        Profiler {
            timing,
            queries,
            device: device.clone(),
            queue: queue.clone(),
            pending: Mutex::new(Pending { labels: Vec::new(), section: NO_SECTION, dropped: 0 }),
            decode: Mutex::new(Totals::default()),
            prefill: Mutex::new(Totals::default()),
        }
    }

    /// How this profiler times dispatches.
    pub fn timing(&self) -> ProfileTiming {
        self.timing
    }

    /// Records `dispatch` (into the open compute pass) timed under the label `kernel`.
    pub(crate) fn bracket(
        &self,
        pass: &mut Pass,
        kernel: &'static str,
        traffic: Traffic,
        dispatch: impl FnOnce(&mut wgpu::ComputePass<'_>),
    ) {
        let mut pending = self.pending.lock().expect("profiler lock");
        let section = pending.section;
        let index = pending.labels.len() as u32 * 2;
        let Some(q) = self.queries.as_ref() else {
            // Submits: drain the queue, then time this dispatch alone. A device lost while
            // waiting fails the step's own read-back, so the wait's result is not needed here.
            drop(pending);
            pass.flush(&self.queue);
            let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
            let start = Instant::now();
            dispatch(pass.compute());
            pass.flush(&self.queue);
            let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
            let ms = start.elapsed().as_secs_f64() * 1e3;
            self.pending.lock().expect("profiler lock").labels.push((kernel, section, traffic, Some(ms)));
            return;
        };
        if index + 2 > MAX_QUERIES {
            pending.dropped += 1;
            dispatch(pass.compute());
            return;
        }
        pending.labels.push((kernel, section, traffic, None));
        if self.timing == ProfileTiming::InsidePasses {
            let compute = pass.compute();
            compute.write_timestamp(&q.set, index);
            dispatch(compute);
            compute.write_timestamp(&q.set, index + 1);
        } else {
            pass.open_timed(wgpu::ComputePassTimestampWrites {
                query_set: &q.set,
                beginning_of_pass_write_index: Some(index),
                end_of_pass_write_index: Some(index + 1),
            });
            dispatch(pass.compute());
            pass.end();
        }
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
        let mut period_ns = 0.0;
        if let Some(q) = self.queries.as_ref().filter(|_| count > 0) {
            let mut encoder = gpu.device.create_command_encoder(&Default::default());
            encoder.resolve_query_set(&q.set, 0..count, &q.resolve, 0);
            gpu.queue.submit([encoder.finish()]);
            q.readback.read(gpu, &q.resolve, 0, bytemuck::cast_slice_mut(&mut ticks))?;
            period_ns = q.period_ns;
        }
        let mut totals = if n_tokens == 1 { &self.decode } else { &self.prefill }.lock().expect("profiler lock");
        totals.steps += 1;
        totals.tokens += n_tokens as u64;
        totals.untimed += dropped;
        for (i, &(kernel, section, traffic, host_ms)) in labels.iter().enumerate() {
            let ms = host_ms.unwrap_or_else(|| ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period_ns / 1e6);
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
