//! The expert cache's view of scheduled requests: each request's start and end (its own
//! activation matrix, [`crate::experts::eam`]) and which rows of a batched step are whose.

use super::plan::Part;
use super::{Engine, Scheduler};
use crate::error::Result;
use crate::experts::cache_model::StepRows;
use crate::experts::eam::RequestKey;
use crate::experts::policy::Phase;
use crate::experts::residency::ExpertStats;

impl Scheduler<'_> {
    /// Tells the expert cache which rows of the step of `parts` belong to which request, in which
    /// phase, so each request's activation matrix counts its own.
    pub(super) fn attribute_rows(&self, parts: &[Part]) {
        if let Some(mut r) = self.engine.model.residency() {
            let rows: Vec<StepRows> = (parts.iter())
                .map(|p| StepRows {
                    request: self.slots[p.slot].running.as_ref().map_or(0, |r| r.id),
                    rows: p.rows(),
                    phase: if p.decode { Phase::Decode } else { Phase::Prefill },
                })
                .collect();
            r.attribute_next_step(&rows);
        }
    }
}

/// Marks the start of scheduled request `key` (the expert cache keeps its own activation
/// matrix; the trace marks a request where `spell_starts`); returns the figures so far.
pub(super) fn begin_scheduled(engine: &Engine, key: RequestKey, spell_starts: bool) -> Result<ExpertStats> {
    match engine.model.residency() {
        Some(mut r) => {
            r.begin_request_of(key, spell_starts)?;
            Ok(r.stats())
        }
        None => Ok(ExpertStats::default()),
    }
}

/// Marks scheduled request `key`'s end (EAMC files its activation matrix); returns the
/// expert figures since `before` (shared with the requests that ran beside it).
pub(super) fn end_scheduled(engine: &Engine, key: RequestKey, before: ExpertStats) -> ExpertStats {
    match engine.model.residency() {
        Some(mut r) => {
            r.end_request_of(key);
            r.stats().since(&before)
        }
        None => ExpertStats::default(),
    }
}
