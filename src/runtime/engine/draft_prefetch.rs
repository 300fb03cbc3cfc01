//! Reading a verify step's experts before it runs. Every token of a verify step is known before
//! it runs (the last token and the drafts after it), and a token tends to route where it routed
//! before: where the same token stood earlier in the sequence (on the bundled model, 69–95% of
//! a layer's experts), and more so where it stood in the same context, which is what a
//! prompt-lookup draft copies. While experts stream, a drafting request keeps its sequence's
//! routing ([`RouteMemory`](crate::experts::route_memory::RouteMemory)) and, before each
//! verify step, starts reading the experts routed at those earlier positions: those reads then
//! overlap the layers before theirs instead of stalling their layer.

use std::collections::HashSet;

use super::Engine;
use crate::experts::policy::ExpertId;
use crate::runtime::options::GenerateOptions;
use crate::runtime::session::Session;

/// A sequence's rows of a verify step: the token at `pos` and the `drafts` after it, copied by
/// prompt lookup from position `copied_from` on (`None`: drafted otherwise, by the MTP module).
#[derive(Clone, Copy, Debug)]
pub(super) struct VerifyRows<'a> {
    pub(super) pos: usize,
    pub(super) drafts: &'a [u32],
    pub(super) copied_from: Option<usize>,
}

impl VerifyRows<'_> {
    /// The earlier positions of `tokens` whose routing these rows are expected to repeat: the
    /// copied span and the position before it, which holds the token at `pos`; without a copy,
    /// for each row, the latest earlier position of its token.
    fn routed_like(&self, tokens: &[u32]) -> Vec<usize> {
        match self.copied_from {
            Some(from) => (from.saturating_sub(1)..from + self.drafts.len()).collect(),
            None => {
                let rows = std::iter::once(tokens[self.pos]).chain(self.drafts.iter().copied());
                rows.filter_map(|t| tokens[..self.pos].iter().rposition(|&u| u == t)).collect()
            }
        }
    }
}

impl Engine {
    /// Makes `session` remember its routing when a request with `options` reads its verify
    /// steps' experts ahead: it drafts, experts stream, and [`Engine::draft_prefetch`] is on
    /// (off, the session forgets it; a request that does not draft keeps adding to it).
    pub(super) fn remember_routing_for(&self, session: &mut Session, options: &GenerateOptions) {
        let drafts = options.drafts.is_some() || options.mtp_drafts > 0;
        if !self.draft_prefetch() {
            session.routes = None;
        } else if drafts && session.routes.is_none() {
            session.routes = self.model.new_route_memory().map(Box::new);
        }
    }

    /// After a step that ran `session`'s positions `pos..pos + rows` as its rows
    /// `first..first + rows`: the session remembers their routing, when it keeps a memory.
    pub(super) fn remember_routing(&self, session: &mut Session, pos: usize, (first, rows): (usize, usize)) {
        let Some(memory) = session.routes.as_mut() else { return };
        let Some(r) = self.model.residency() else { return };
        memory.record(pos, (first, rows), |layer| r.step_routing(layer));
    }

    /// Before a verify step of the sequences' `rows`: starts reading the experts each
    /// sequence's remembered routing gives where the rows are expected to repeat it
    /// (`VerifyRows::routed_like`; nearest layer first, the experts of the sequences before
    /// first within a layer). Nothing is looked up for a sequence that keeps no memory.
    pub(super) fn prefetch_for_verify<'s>(&self, rows: impl IntoIterator<Item = (&'s Session, VerifyRows<'s>)>) {
        if !self.draft_prefetch() {
            // Switched off while requests that remember their routing run.
            return;
        }
        let mut expected: Vec<ExpertId> = Vec::new();
        for (session, rows) in rows {
            if let Some(memory) = &session.routes {
                expected.extend(memory.experts_of(rows.routed_like(&session.tokens)));
            }
        }
        if expected.is_empty() {
            return;
        }
        expected.sort_by_key(|id| id.layer);
        let mut seen = HashSet::new();
        expected.retain(|&id| seen.insert(id));
        if let Some(mut r) = self.model.residency() {
            r.prefetch_expected(self.gpu(), &expected);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::VerifyRows;

    #[test]
    fn rows_are_expected_to_route_where_they_were_copied_from_or_their_token_last_stood() {
        let tokens = [5, 6, 7, 8, 5, 6];
        let like = |pos, drafts: &[u32], copied_from| VerifyRows { pos, drafts, copied_from }.routed_like(&tokens);
        // Prompt lookup drafted 7, 8 after the 6 at 5, copied from 2: the 6 at 1 and the span.
        assert_eq!(like(5, &[7, 8], Some(2)), vec![1, 2, 3]);
        // Other drafts: each row's token where it last stood before the step; 9 never did.
        assert_eq!(like(5, &[5, 9, 8], None), vec![1, 4, 3]);
        assert_eq!(like(0, &[5], None), Vec::<usize>::new());
    }
}
