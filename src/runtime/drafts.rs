//! Speculative decoding's drafts: a request's counts and pacing ([`DraftCounts`],
//! [`DraftPacing`]), and prompt-lookup drafts ([`PromptLookup`]), speculative decoding without a
//! draft model: the tokens that followed the latest earlier occurrence of the sequence's last n
//! tokens (the longest n that occurs) are proposed as the next ones, and one step verifies them
//! all ([`crate::decoder::GpuModel::step_drafted`]): code edits, quotes, retrieved passages and
//! loops repeat what came before, and each accepted draft token is a decode step saved.
//! Verification keeps the output exactly what decoding one token at a time gives, token for
//! token: each row's token is picked as one token a step picks it (greedy, the argmax;
//! sampling, a draw under the same key), until one differs from its draft — a prompt-lookup
//! draft of sampled text is accepted with its probability (an MTP draft, picked under the key's
//! noise, whenever module and model agree under it).

use crate::error::{Error, Result};
use crate::runtime::options::GenerateOptions;

/// MTP drafts a step where the caller names no number (the CLI's `--speculative auto|mtp`).
pub const DEFAULT_MTP_DRAFTS: usize = 3;

/// Longest n-gram prompt lookup matches unless told: the longest match wins, and in code (where
/// a tokenizer may give each space and bracket a token) a short n-gram such as an indentation
/// recurs on every line, pointing at the wrong one (measured in benches/README.md).
pub const DEFAULT_LOOKUP_NGRAM: usize = 12;

/// How drafts are looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest n-gram looked up (the last n tokens; the longest that occurs earlier wins).
    pub ngram: usize,
    /// Most tokens drafted per step.
    pub max_draft: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup { ngram: DEFAULT_LOOKUP_NGRAM, max_draft: 4 }
    }
}

impl PromptLookup {
    /// Refuses sizes outside 1..=32.
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [("draft n-gram", self.ngram), ("draft length", self.max_draft)] {
            if !(1..=32).contains(&v) {
                return Err(Error::InvalidArgument(format!("{what} {v} must be in 1..=32")));
            }
        }
        Ok(())
    }

    /// At most `limit` (and `max_draft`) tokens proposed after `history`: what followed the
    /// latest earlier occurrence of its last n tokens, for the longest n up to `ngram` that
    /// occurs (empty when none does), and the position they were copied from (that of the
    /// first; 0 when there are none).
    pub fn draft(&self, history: &[u32], limit: usize) -> (Vec<u32>, usize) {
        let limit = limit.min(self.max_draft);
        let len = history.len();
        if limit == 0 {
            return (Vec::new(), 0);
        }
        for n in (1..=self.ngram.min(len.saturating_sub(1))).rev() {
            let tail = &history[len - n..];
            // Latest first, never the tail itself.
            if let Some(start) = (0..len - n).rev().find(|&i| &history[i..i + n] == tail) {
                let after = start + n;
                return (history[after..(after + limit).min(len)].to_vec(), after);
            }
        }
        (Vec::new(), 0)
    }
}

/// A request's drafts so far, and how many it may propose next.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DraftCounts {
    /// Drafts proposed.
    pub(crate) proposed: usize,
    /// Of those, accepted.
    pub(crate) accepted: usize,
    /// Steps that verified drafts.
    pub(crate) steps: usize,
    /// With drafts.
    pacing: Option<DraftPacing>,
    /// Whether the pacing is told what steps take ([`crate::runtime::Engine::draft_payoff`]).
    payoff: bool,
}

impl DraftCounts {
    /// The counts of a request with `options` (paced where it drafts; by time too with
    /// `payoff`).
    pub(crate) fn new(options: &GenerateOptions, payoff: bool) -> DraftCounts {
        let mut pacing = match options.mtp_drafts {
            0 => options.drafts.map(|d| DraftPacing::passages(d.max_draft)),
            n => Some(DraftPacing::new(n)),
        };
        if payoff {
            // Time a plain step first, so the first drafting cycles have a step to compare with.
            pacing.iter_mut().for_each(DraftPacing::plain_first);
        }
        DraftCounts { pacing, payoff, ..Default::default() }
    }

    /// The most drafts to propose at this step (each call is one step; 0 without drafts).
    pub(crate) fn allowance(&mut self) -> usize {
        self.pacing.as_mut().map_or(0, DraftPacing::allowance)
    }

    /// Records that a step produced `tokens` tokens in `secs` seconds, drafted or plain (the
    /// pacing pauses drafting that costs more time than it saves).
    pub(crate) fn timed(&mut self, drafted: bool, tokens: usize, secs: f64) {
        if let Some(pacing) = self.pacing.as_mut().filter(|_| self.payoff) {
            pacing.timed(drafted, tokens, secs);
        }
    }

    /// Counts a step that verified `proposed` drafts and accepted `accepted` of them.
    pub(crate) fn count(&mut self, proposed: usize, accepted: usize) {
        self.proposed += proposed;
        self.accepted += accepted;
        self.steps += 1;
        if let Some(pacing) = &mut self.pacing {
            pacing.record(proposed, accepted);
        }
    }
}

/// Tokens each verify step produced on average: its `accepted` drafts (over all `steps`) and the
/// token after them (0 steps: 0).
pub fn tokens_per_verify_step(accepted: usize, steps: usize) -> f64 {
    match steps {
        0 => 0.0,
        _ => (accepted + steps) as f64 / steps as f64,
    }
}

/// How many drafts a request proposes next, from how its drafts fared: a verify step costs more
/// than a plain one wherever the step is not bound by weight reads (and on a streamed model reads
/// the rejected drafts' experts), so after a step that accepted none the request pauses
/// drafting for a number of steps that doubles with each such step (up to 16), and the most it
/// drafts follows what was accepted. Where it is told what steps take ([`DraftPacing::timed`]),
/// it also pauses for [`PAYOFF_PAUSE`] steps whenever drafting has cost more time per token than
/// plain steps do (sampled text, whose drafts are accepted less often, on an adapter where a
/// verify step costs much more than one token's), measuring plain steps now and then to know.
/// The output is the same either way (greedy: token for token; sampling: the same distribution).
#[derive(Clone, Copy, Debug)]
pub struct DraftPacing {
    max: usize,
    limit: usize,
    paused: usize,
    backoff: usize,
    /// Seconds and tokens of plain steps and of drafting cycles, where timed, each earlier one
    /// weighing [`DECAY`] times the next of its kind (so one unlucky cycle does not decide);
    /// with [`DraftPacing::passages`], a drafting cycle weighs [`DECAY`] times less with each
    /// step after it, plain or drafted.
    timed: [(f64, f64); 2],
    /// Whether what drafting cost fades over the steps after it ([`DraftPacing::passages`]).
    fades: bool,
    /// Drafting cycles timed since the last plain step was.
    cycles_since_plain: usize,
    /// Drafting cycles timed since drafting last paused for its time (or began).
    cycles_since_pause: usize,
}

/// Steps a request goes without drafting when drafting cost more time per token than plain steps.
pub const PAYOFF_PAUSE: usize = 32;

/// Drafting cycles timed before their time may pause drafting: the first cycles of a copied
/// passage often fail where it starts (and the first step of a new size costs more).
const PAYOFF_EVIDENCE: usize = 4;

/// Drafting cycles between two plain steps timed to compare with.
const PLAIN_EVERY: usize = 16;

/// The weight of a step's time against the next one's in [`DraftPacing::timed`].
const DECAY: f64 = 0.9;

impl DraftPacing {
    /// Pacing for drafts of up to `max` tokens.
    pub fn new(max: usize) -> DraftPacing {
        DraftPacing {
            max,
            limit: max,
            paused: 0,
            backoff: 0,
            timed: [(0.0, 0.0); 2],
            fades: false,
            cycles_since_plain: 0,
            cycles_since_pause: 0,
        }
    }

    /// Pacing for drafts that come in passages, as prompt lookup's do (a copied span is
    /// accepted whole, the text around it not at all): a cycle that accepted nothing is left to
    /// the backoff and not timed, what drafting cost before a pause has faded when it resumes,
    /// and drafting pauses for its time only after [`PAYOFF_EVIDENCE`] timed cycles, so a
    /// passage that pays is drafted from even where the drafts before it failed. (MTP drafts,
    /// accepted at a steady rate, keep [`DraftPacing::new`]'s memory: there a cycle that cost
    /// more than it saved predicts the next.)
    pub fn passages(max: usize) -> DraftPacing {
        DraftPacing { fades: true, ..DraftPacing::new(max) }
    }

    /// Makes the next step a plain one, to time ([`DraftPacing::timed`]) before drafting.
    pub fn plain_first(&mut self) {
        self.cycles_since_plain = PLAIN_EVERY;
    }

    /// The most tokens to draft at this step (0 while paused; each call is one step).
    pub fn allowance(&mut self) -> usize {
        if self.paused > 0 {
            self.paused -= 1;
            return 0;
        }
        if self.cycles_since_plain >= PLAIN_EVERY {
            // A plain step to compare the drafting cycles with.
            self.cycles_since_plain = 0;
            return 0;
        }
        self.limit
    }

    /// Records that a step produced `tokens` tokens in `secs` seconds, `drafted` or plain; when
    /// drafting took longer per token than plain steps, pauses it for [`PAYOFF_PAUSE`] steps.
    pub fn timed(&mut self, drafted: bool, tokens: usize, secs: f64) {
        if self.fades && drafted && tokens <= 1 {
            // Drafts that came in passages and were all rejected: paced by the backoff of
            // `record`, not timed (the passage that follows is what the time should judge).
            return;
        }
        let [plain, drafting] = &mut self.timed;
        // Each kind's earlier steps weigh DECAY less; passages' drafting also fades by the step.
        for (sum, ages) in [(plain, !drafted), (drafting, drafted || self.fades)] {
            if ages {
                *sum = (DECAY * sum.0, DECAY * sum.1);
            }
        }
        let (s, n) = &mut self.timed[usize::from(drafted)];
        (*s, *n) = (*s + secs, *n + tokens as f64);
        match drafted {
            true => {
                self.cycles_since_plain += 1;
                self.cycles_since_pause += 1;
            }
            false => self.cycles_since_plain = 0,
        }
        let [(plain_s, plain_n), (drafted_s, drafted_n)] = self.timed;
        let evidence = !self.fades || self.cycles_since_pause >= PAYOFF_EVIDENCE;
        if drafted && evidence && plain_n > 0.0 && drafted_s / drafted_n > plain_s / plain_n {
            self.paused = self.paused.max(PAYOFF_PAUSE);
            self.cycles_since_pause = 0;
        }
    }

    /// Records a verify step that accepted `accepted` of `proposed` drafts.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        if accepted == 0 {
            self.backoff = (self.backoff * 2).clamp(1, 16);
            self.paused = self.backoff;
            self.limit = (self.limit / 2).max(1);
        } else {
            self.backoff = 0;
            // All accepted: one more next time; else what was accepted and one.
            self.limit = if accepted == proposed { self.limit + 1 } else { accepted + 1 }.min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DraftPacing, PromptLookup};

    #[test]
    fn pacing_backs_off_after_rejections_and_recovers() {
        let mut p = DraftPacing::new(4);
        assert_eq!(p.allowance(), 4);
        p.record(4, 0);
        // Paused one step, then at most 2.
        assert_eq!((p.allowance(), p.allowance()), (0, 2));
        p.record(2, 0);
        assert_eq!((p.allowance(), p.allowance(), p.allowance()), (0, 0, 1));
        p.record(1, 1);
        assert_eq!(p.allowance(), 2);
        p.record(2, 2);
        p.record(3, 3);
        p.record(4, 4);
        assert_eq!(p.allowance(), 4, "never above the maximum");
        p.record(4, 1);
        assert_eq!(p.allowance(), 2);
        for _ in 0..10 {
            p.record(1, 0);
        }
        let paused = (0..40).take_while(|_| p.allowance() == 0).count();
        assert_eq!(paused, 16, "the pause doubles up to 16 steps");
    }

    #[test]
    fn timed_pacing_times_a_plain_step_before_drafting() {
        let mut p = DraftPacing::new(3);
        p.plain_first();
        assert_eq!(p.allowance(), 0, "a plain step to compare with");
        p.timed(false, 1, 0.001);
        assert_eq!(p.allowance(), 3);
        // The first cycle already compares: at 2 ms a token against 1 ms it pauses drafting.
        p.record(3, 2);
        p.timed(true, 3, 0.006);
        assert_eq!(p.allowance(), 0);
    }

    #[test]
    fn prompt_lookup_pacing_drafts_a_passage_that_pays_after_failed_drafts() {
        // Plain steps at 1 ms; two failed cycles at 4 ms, then a copied passage: 5 tokens a
        // cycle in 3 ms. MTP pacing remembers the failures and pauses; prompt lookup's drafts
        // the passage.
        let run = |mut p: DraftPacing| {
            p.timed(false, 1, 0.001);
            let mut drafted = 0;
            for step in 0..40 {
                match p.allowance() {
                    0 => p.timed(false, 1, 0.001),
                    n if step < 4 => {
                        p.record(n, 0);
                        p.timed(true, 1, 0.004);
                    }
                    n => {
                        drafted += 1;
                        p.record(n, n);
                        p.timed(true, n + 1, 0.003);
                    }
                }
            }
            drafted
        };
        let (steady, passages) = (run(DraftPacing::new(4)), run(DraftPacing::passages(4)));
        assert!(passages >= 30, "prompt lookup drafted {passages} of 40 steps");
        assert!(steady < 10, "MTP pacing drafted {steady} of 40 steps");
    }

    #[test]
    fn pacing_pauses_drafting_that_costs_more_time_than_it_saves() {
        // Drafting cycles at 2 ms a token, plain steps at 1 ms: drafting pauses.
        let mut p = DraftPacing::new(3);
        let cycle = |p: &mut DraftPacing| {
            assert_eq!(p.allowance(), 3);
            p.record(3, 2);
            p.timed(true, 3, 0.006);
        };
        // No plain step timed yet: drafting goes on until one is, every 16 cycles.
        for _ in 0..16 {
            cycle(&mut p);
        }
        assert_eq!(p.allowance(), 0, "a plain step to compare with");
        p.timed(false, 1, 0.001);
        cycle(&mut p);
        let paused = (0..64).take_while(|_| p.allowance() == 0).count();
        assert_eq!(paused, super::PAYOFF_PAUSE);
        // Drafting that pays (3 tokens in the time of two plain ones) goes on.
        let mut q = DraftPacing::new(3);
        q.timed(false, 1, 0.001);
        let mut plain = 0;
        for _ in 0..51 {
            match q.allowance() {
                0 => {
                    plain += 1;
                    q.timed(false, 1, 0.001);
                }
                n => {
                    q.record(n, n - 1);
                    q.timed(true, n, 0.002);
                }
            }
        }
        assert_eq!(plain, 3, "only the plain steps it compares with");
    }

    #[test]
    fn drafts_follow_the_latest_longest_match() {
        let p = PromptLookup { ngram: 3, max_draft: 4 };
        // "5 6 7" occurred at 1..4, followed by 8 9; the latest "7" alone at 3 too.
        assert_eq!(p.draft(&[4, 5, 6, 7, 8, 9, 1, 5, 6, 7], 10).0, vec![8, 9, 1, 5]);
        assert_eq!(p.draft(&[4, 5, 6, 7, 8, 9, 1, 5, 6, 7], 2), (vec![8, 9], 4));
        // Only a 1-gram occurs: what followed its latest occurrence.
        assert_eq!(p.draft(&[3, 1, 4, 3, 2, 9, 3], 4).0, vec![2, 9, 3]);
        assert!(p.draft(&[1, 2, 3], 4).0.is_empty());
        assert!(p.draft(&[7], 4).0.is_empty());
        assert!(p.draft(&[], 4).0.is_empty());
        assert!(PromptLookup { ngram: 0, max_draft: 4 }.validate().is_err());
        assert!(PromptLookup { ngram: 3, max_draft: 33 }.validate().is_err());
    }
}
