//! Optimistic streaming decode steps. A streaming step normally waits for every MoE layer's
//! routing before recording that layer's experts (a host round trip per MoE layer, even when
//! every routed expert is already in a slot). An optimistic step instead runs the whole token
//! as one submission, the expert kernels finding their experts through the slot table as it
//! stands, and copies each layer's routed ids into one readback. Afterwards the host checks
//! them against the table the step ran with: when every routed expert had a slot, the step was
//! exact and the expert cache is told about its routing after the fact; when one had none (its
//! pairs were skipped), the step is discarded and run again layer by layer, the routing of the
//! layers up to the first miss taken from the log (it was exact there). Rerunning a step
//! rewrites the same KV positions with the same values, and linear-attention states are copied
//! aside before an optimistic step and back after a discarded one, so the tokens and logits
//! are those of the layered step either way.
//!
//! [`OptimisticSteps::Auto`] tries it only where it pays: it keeps a moving record of how often
//! a decode step's routing was all in slots (`p`) and of how long an all-hit step takes each
//! way, and runs optimistically while `p × layered time > optimistic time` (a discarded step
//! costs its own time on top of the layered one).

use std::sync::Mutex;

use super::step::{Routing, TokenSource};
use super::{GpuModel, SequenceCache, StepOutput, StepResult};
use crate::env_choice::env_choice;
use crate::error::Result;
use crate::experts::policy::Phase;
use crate::gpu::Pass;

/// Whether streaming decode steps run optimistically (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimisticSteps {
    /// When the recent hit record and the measured step times say it pays (the default).
    Auto,
    /// Every step that can (for tests and comparisons).
    Always,
    /// Never: each MoE layer's routing comes back before its experts run.
    Never,
}

impl OptimisticSteps {
    /// `MOESTREAM_OPTIMISTIC_STEPS`: `auto` (or unset), `on`, `off`.
    pub fn from_env() -> Result<OptimisticSteps> {
        let choices =
            [("auto", OptimisticSteps::Auto), ("on", OptimisticSteps::Always), ("off", OptimisticSteps::Never)];
        Ok(env_choice("MOESTREAM_OPTIMISTIC_STEPS", &choices)?.unwrap_or(OptimisticSteps::Auto))
    }
}

/// Weight of the newest step in the moving averages.
const NEWEST: f64 = 0.2;

/// Steps run one way before `Auto` times one the other way.
const REMEASURE_AFTER: u32 = 16;

/// The mode and the moving record [`OptimisticSteps::Auto`] decides by.
pub(super) struct Optimism {
    state: Mutex<Record>,
}

struct Record {
    mode: OptimisticSteps,
    /// Moving share of decode steps whose routed experts were all in slots.
    all_hit: f64,
    /// Moving milliseconds of an all-hit step run layer by layer, and optimistically.
    layered_ms: Option<f64>,
    optimistic_ms: Option<f64>,
    /// Steps `Auto` has run the same way since it last ran one the other way.
    same_way: u32,
}

fn moving(average: Option<f64>, newest: f64) -> f64 {
    average.map_or(newest, |a| a + NEWEST * (newest - a))
}

impl Optimism {
    pub(super) fn new(mode: OptimisticSteps) -> Optimism {
        Optimism {
            state: Mutex::new(Record { mode, all_hit: 0.0, layered_ms: None, optimistic_ms: None, same_way: 0 }),
        }
    }

    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.state.lock().expect("optimism lock")
    }

    pub(super) fn mode(&self) -> OptimisticSteps {
        self.record().mode
    }

    pub(super) fn set_mode(&self, mode: OptimisticSteps) {
        self.record().mode = mode;
    }

    /// Whether the next eligible step should run optimistically. Every
    /// [`REMEASURE_AFTER`] steps run one way, `Auto` runs one the other way, so that both
    /// times stay current (a step's time changes as the sequence grows).
    pub(super) fn wants(&self) -> bool {
        let mut r = self.record();
        let prefer = match (r.mode, r.layered_ms, r.optimistic_ms) {
            (OptimisticSteps::Always, ..) => return true,
            (OptimisticSteps::Never, ..) => return false,
            // Not yet measured: worth a try once most recent steps hit.
            (OptimisticSteps::Auto, _, None) => r.all_hit >= 0.5,
            (OptimisticSteps::Auto, None, Some(_)) => true,
            (OptimisticSteps::Auto, Some(layered), Some(optimistic)) => r.all_hit * layered > optimistic,
        };
        let remeasure = r.same_way >= REMEASURE_AFTER && (prefer || r.all_hit >= 0.5);
        r.same_way = if remeasure { 0 } else { r.same_way + 1 };
        prefer != remeasure
    }

    /// A step ran layer by layer in `ms`; `all_hit`: every routed expert was in a slot when
    /// its routing came back.
    pub(super) fn layered(&self, all_hit: bool, ms: f64) {
        let mut r = self.record();
        r.all_hit = moving(Some(r.all_hit), f64::from(u8::from(all_hit)));
        if all_hit {
            r.layered_ms = Some(moving(r.layered_ms, ms));
        }
    }

    /// An optimistic step was kept (and took `ms`) or discarded.
    pub(super) fn optimistic(&self, kept: bool, ms: f64) {
        let mut r = self.record();
        r.all_hit = moving(Some(r.all_hit), f64::from(u8::from(kept)));
        if kept {
            r.optimistic_ms = Some(moving(r.optimistic_ms, ms));
        }
    }
}

impl GpuModel {
    /// How streaming decode steps are run ([`OptimisticSteps`]).
    pub fn optimistic_steps(&self) -> OptimisticSteps {
        self.optimism.mode()
    }

    /// Sets how streaming decode steps are run; the tokens are the same every way.
    pub fn set_optimistic_steps(&self, mode: OptimisticSteps) {
        self.optimism.set_mode(mode);
    }

    /// Whether a step of `n` tokens in `phase` on `cache` could run optimistically: a
    /// one-token decode step of a model whose MoE routing comes back to the host (streaming or
    /// tracing), with nothing else needing the host between layers (observer, prerouter), on a
    /// cache whose linear-attention states (if any) can be put back. A profile counts a
    /// discarded step's dispatches with its rerun's, as the time they took.
    pub(super) fn optimistic_eligible(&self, phase: Phase, n: usize) -> bool {
        phase == Phase::Decode
            && n == 1
            && self.prerouter.is_none()
            && self.observer.lock().expect("observer lock").is_none()
            && self.residency().is_some_and(|r| r.needs_routing())
    }

    /// One optimistic step: its result, or when a routed expert had no slot the routed ids it
    /// computed exactly, those of every MoE layer up to the first such one (whose inputs came
    /// from experts that all had slots). The step is then to be run layer by layer, those
    /// layers' routing known without reading it back; linear-attention states are back as
    /// they were.
    pub(super) fn try_optimistic(
        &self,
        cache: &SequenceCache,
        n: usize,
        pos: usize,
        output: StepOutput<'_>,
    ) -> Result<std::result::Result<StepResult, Vec<u32>>> {
        let gpu = &*self.gpu;
        // Made with the cache when the model streams; a no-op then.
        cache.ensure_state_copies()?;
        let mut rec = Pass::new(&gpu.device);
        cache.save_linear_state(rec.encoder());
        let mut routing = Routing::Logged;
        let mut rec = self.record_step(
            rec,
            super::step::Sequences::One { cache, pos },
            n,
            Phase::Decode,
            output,
            TokenSource::Host,
            &mut routing,
        )?;
        let moe_layers = &self.moe_layers;
        let k = self.spec.moe.as_ref().map_or(0, |m| m.top_k) * n;
        // The layers' ids were copied into the log as the step ran, and a greedy token goes
        // after them: one wait reads them all.
        let greedy = matches!(output, StepOutput::Argmax);
        let mut ids = vec![0u32; moe_layers.len() * k + usize::from(greedy)];
        let len = (ids.len() * 4) as u64;
        if greedy {
            self.routing_log.record_copy_at(rec.encoder(), &self.acts.argmax, 0, 4, len - 4)?;
        }
        let submission = rec.submit(&gpu.queue);
        self.routing_log.map(len).finish(gpu, Some(submission), bytemuck::cast_slice_mut(&mut ids))?;
        let token = greedy.then(|| ids.pop().expect("the greedy token follows the ids"));
        let mut r = self.residency().expect("optimistic steps imply an expert residency");
        let experts = r.table.experts();
        let first_miss = moe_layers.iter().zip(ids.chunks(k.max(1))).position(|(&layer, routed)| {
            !routed.iter().all(|&e| (e as usize) < experts && r.table.get(layer, e as usize).is_some())
        });
        if let Some(m) = first_miss {
            r.count_optimistic(false);
            drop(r);
            let mut restore = Pass::new(&gpu.device);
            cache.restore_linear_state(restore.encoder());
            restore.submit(&gpu.queue);
            cache.end_step(pos);
            ids.truncate((m + 1) * k);
            return Ok(Err(ids));
        }
        // Tell the expert cache what the step used: every layer's routing (all hits), then the
        // predictor's prefetches (for the next token; routing them between layers could evict
        // an expert a later layer of this step used).
        r.begin_step(Phase::Decode, n);
        for (&layer, routed) in moe_layers.iter().zip(ids.chunks(k.max(1))) {
            for wave in r.route(layer, routed) {
                r.apply_wave(gpu, layer, &wave)?;
            }
        }
        for &layer in moe_layers {
            r.prefetch(gpu, layer);
        }
        r.land_prefetches(gpu)?;
        r.end_step()?;
        r.count_optimistic(true);
        drop(r);
        let result = match token {
            Some(id) => StepResult::Token(Self::greedy_token(id, pos + n - 1)?),
            None => self.collect(n, pos, output)?,
        };
        cache.end_step(pos + n);
        Ok(Ok(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `Auto` chooses over `steps` eligible steps when every step hits and a layered step
    /// takes `layered` ms, an optimistic one `optimistic` ms: how many ran optimistically.
    fn optimistic_share(layered: f64, optimistic: f64, hit: bool, steps: usize) -> usize {
        let o = Optimism::new(OptimisticSteps::Auto);
        (0..steps)
            .filter(|_| {
                let tried = o.wants();
                match tried {
                    true => o.optimistic(hit, optimistic),
                    false => o.layered(hit, layered),
                }
                tried
            })
            .count()
    }

    #[test]
    fn auto_prefers_the_faster_way_and_remeasures_the_other() {
        // Optimistic twice as fast: after the first few steps (the hit record rising to one
        // half), every step but one in REMEASURE_AFTER + 1 runs optimistically.
        let faster = optimistic_share(10.0, 5.0, true, 200);
        assert!((180..=190).contains(&faster), "{faster} of 200");
        // Optimistic slower: one try, then only the remeasurements.
        let slower = optimistic_share(10.0, 12.0, true, 200);
        assert!((1..=15).contains(&slower), "{slower} of 200");
        // Every step misses: never tried, not even to remeasure.
        assert_eq!(optimistic_share(10.0, 1.0, false, 200), 0);
    }

    #[test]
    fn auto_weighs_the_time_by_the_hit_record() {
        // p × layered > optimistic: at p = 0.4 and 9 ms layered, optimistic pays below 3.6 ms.
        let o = Optimism::new(OptimisticSteps::Auto);
        {
            let mut r = o.record();
            (r.all_hit, r.layered_ms, r.optimistic_ms) = (0.4, Some(9.0), Some(3.0));
        }
        assert!(o.wants());
        o.record().optimistic_ms = Some(3.7);
        assert!(!o.wants());
        o.set_mode(OptimisticSteps::Always);
        assert!(o.wants());
        o.set_mode(OptimisticSteps::Never);
        o.record().optimistic_ms = Some(0.1);
        assert!(!o.wants());
    }
}
