//! A scheduler step's plan: which tokens of which sequences it runs ([`Part`]).

use super::slot::Slot;
use super::Scheduler;
use crate::decoder::Rows;
use crate::error::Error;

/// What a slot runs in a step: its tokens from `pos`, and whether the logits after them are
/// wanted; a decode token may take drafts after it (then every row's logits are wanted).
pub(super) struct Part {
    pub(super) slot: usize,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) logits: Rows,
    pub(super) drafts: Vec<u32>,
    /// Where prompt lookup copied the drafts from (the first's position).
    pub(super) copied_from: Option<usize>,
    /// A decode token (and its drafts), not a prompt chunk.
    pub(super) decode: bool,
}

impl Part {
    /// Its rows in the step: its tokens and the drafts after them.
    pub(super) fn rows(&self) -> usize {
        self.end + self.drafts.len() - self.start
    }
}

impl Scheduler<'_> {
    /// This step's parts: every decode token, with the drafts its request proposes in what is
    /// left of the step (first come, first served: by prompt lookup, or from its MTP module),
    /// then prompt chunks in the order the requests came, within `max_batch` tokens; the
    /// requests whose MTP module failed (they take no part); and whether the step's time goes
    /// to the drafts' payoff.
    pub(super) fn plan(&mut self) -> (Vec<Part>, Vec<(usize, Error)>, bool) {
        let (engine, mut failed) = (self.engine, Vec::new());
        let mut budget = engine.model.options().max_batch;
        let mut parts = Vec::new();
        let decoding: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].running.as_ref().is_some_and(|r| r.next.is_some()))
            .collect();
        budget -= decoding.len();
        let drafting = |i: &usize| {
            let r = self.slots[*i].running.as_ref().expect("a decoding request");
            r.options.drafts.is_some() || r.options.mtp_drafts > 0
        };
        let timed = engine.draft_payoff() && decoding.iter().any(drafting);
        // Each step with drafting requests counts towards the payoff's pause.
        let paying = if timed { self.payoff.allowance() } else { usize::MAX };
        for i in decoding {
            let Slot { session, running } = &mut self.slots[i];
            let r = running.as_mut().expect("a decoding request");
            // The drafts it may propose at this step (its pacing counts each call).
            let allowance = r.drafted.allowance();
            let end = session.len();
            // Room for drafts: tokens still wanted after the next one, the context, the step.
            let wanted = r.options.max_tokens - r.generated.len() - 1;
            let room = wanted.min(engine.context() - end).min(budget).min(allowance).min(paying);
            let (drafts, copied_from) = match r.mtp.as_mut() {
                Some(m) if room > 0 => match m.catch_up(engine, session, (end - 1, room), &r.picker) {
                    Ok(drafts) => (drafts, None),
                    Err(e) => {
                        failed.push((i, e));
                        continue;
                    }
                },
                // Not drafting at this step: the module skips these positions.
                Some(m) => {
                    m.skip_to(end - 1);
                    (Vec::new(), None)
                }
                None => match r.options.drafts.map(|d| d.draft(&session.tokens, room)) {
                    Some((drafts, from)) if !drafts.is_empty() => (drafts, Some(from)),
                    _ => (Vec::new(), None),
                },
            };
            budget -= drafts.len();
            let logits = if drafts.is_empty() { Rows::Last } else { Rows::All };
            parts.push(Part { slot: i, start: end - 1, end, logits, drafts, copied_from, decode: true });
        }
        let running = || self.slots.iter().enumerate().filter_map(|(i, s)| s.running.as_ref().map(|r| (i, s, r)));
        let mut prefilling: Vec<_> = running()
            .filter(|(_, s, r)| r.next.is_none() && r.fork_of.is_none() && s.session.cached < s.session.len())
            .collect();
        prefilling.sort_by_key(|(_, _, r)| r.id);
        for (i, s, r) in prefilling {
            if budget == 0 {
                break;
            }
            let (start, len) = (s.session.cached, s.session.len());
            let end = len.min(start + budget);
            budget -= end - start;
            let logits = match (r.options.prompt_logprobs, end == len && r.options.max_tokens > 0) {
                (true, _) => Rows::All,
                (false, true) => Rows::Last,
                (false, false) => Rows::None,
            };
            parts.push(Part { slot: i, start, end, logits, drafts: Vec::new(), copied_from: None, decode: false });
        }
        (parts, failed, timed)
    }
}
