//! Reading a verify step's experts before it runs. A prompt-lookup draft copies the tokens
//! that followed an earlier occurrence of the sequence's last tokens, so the verify step runs
//! tokens that already ran in much the same context. While experts stream, a request drafting
//! so keeps its sequence's routing ([`RouteMemory`](crate::experts::route_memory::RouteMemory))
//! and, before each verify step, starts reading the experts routed at the copied positions:
//! those reads then overlap the layers before theirs instead of stalling their layer.

use std::collections::HashSet;

use super::Engine;
use crate::experts::policy::ExpertId;
use crate::runtime::options::GenerateOptions;
use crate::runtime::session::Session;

/// A verify step's rows of one sequence: its last token and the drafts after it, copied from
/// the position `from` on (the last token repeats the one before `from`).
#[derive(Clone, Copy, Debug)]
pub(super) struct CopiedRows {
    /// Where the first draft was copied from.
    pub(super) from: usize,
    /// How many drafts.
    pub(super) drafts: usize,
}

impl Engine {
    /// Makes `session` remember its routing when a request with `options` reads its verify
    /// steps' experts ahead: it drafts by prompt lookup, experts stream, and
    /// [`Engine::draft_prefetch`] is on.
    pub(super) fn remember_routing_for(&self, session: &mut Session, options: &GenerateOptions) {
        if options.drafts.is_some() && self.draft_prefetch() && session.routes.is_none() {
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

    /// Before a verify step of the sequences' `copied` rows: starts reading the experts routed
    /// where they were copied from (each sequence's, nearest layer first, those of the
    /// sequences before it first within a layer).
    pub(super) fn prefetch_copied<'s>(&self, copied: impl IntoIterator<Item = (&'s Session, CopiedRows)>) {
        let mut expected: Vec<ExpertId> = Vec::new();
        for (session, rows) in copied {
            if let Some(memory) = &session.routes {
                let first = rows.from.saturating_sub(1);
                expected.extend(memory.experts_of(first..rows.from + rows.drafts));
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
