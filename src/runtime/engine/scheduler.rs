//! Many requests at once ([`Scheduler`]): up to `parallel` sequences share every step. Requests
//! join and leave between steps, first come first served; each step carries one decode token
//! of every running request and, in what is left of the step's `max_batch` tokens, chunks of
//! the prompts being prefilled (the longest-waiting first), so a long prompt does not stall the
//! others. Each slot keeps its sequence after a request ends, and a new request goes to the
//! idle slot sharing the longest prefix with its prompt (a conversation's next turn or a shared
//! system prompt is not prefilled again). Several choices of one prompt ([`Scheduler::submit_n`])
//! prefill it once: the other choices' slots copy its caches and sample their first tokens from
//! the same logits.

use std::collections::VecDeque;
use std::time::Instant;

use crate::decoder::{BatchEntry, RoutingMode, Rows};
use crate::error::{Error, Result};
use crate::experts::policy::Phase;
use crate::runtime::drafts::DraftPacing;
use crate::runtime::logprobs::{token_logprob, TokenLogprob};
use crate::runtime::session::Session;
use crate::runtime::stats::Stats;

mod expert_cache;
mod plan;
mod slot;

use expert_cache::{begin_scheduled, end_scheduled};
use plan::Part;
use slot::{Running, Slot, SlotSession};

use super::draft_prefetch::VerifyRows;
use super::generation::{Picker, RequestFigures};
use super::mtp_drafts::MtpDrafts;
use super::{Engine, GenerateOptions, Generation};

/// Identifies a request within its [`Scheduler`].
pub type RequestId = u64;

/// Called with each generated token, its text and (when the request asked for them) its
/// log-probabilities; returns `false` to end the request there.
pub type OnToken<'a> = Box<dyn FnMut(u32, &str, Option<&TokenLogprob>) -> bool + 'a>;

/// A request that has ended: its generation (the tokens it produced, also when it was
/// cancelled), or why it failed.
pub struct Finished {
    /// The request.
    pub id: RequestId,
    /// What it produced.
    pub result: Result<Generation>,
}

/// A request waiting for a slot.
struct Waiting<'a> {
    id: RequestId,
    prompt: Vec<u32>,
    options: GenerateOptions,
    picker: Picker,
    on_token: OnToken<'a>,
    /// The slot it must run in ([`Scheduler::submit_to`]), or any.
    slot: Option<usize>,
    /// Further choices of the same prompt: forked from this request once its prompt is in.
    siblings: Vec<Choice<'a>>,
}

/// A further choice of a waiting prompt: its id, options, token picker and callback.
type Choice<'a> = (RequestId, GenerateOptions, Picker, OnToken<'a>);

/// Runs many requests on one engine, several sequences per step (see the module's doc).
pub struct Scheduler<'a> {
    engine: &'a Engine,
    slots: Vec<Slot<'a>>,
    waiting: VecDeque<Waiting<'a>>,
    next_id: RequestId,
    /// Requests cancelled while waiting, reported by the next step.
    ended: Vec<Finished>,
    /// Steps run, and the sequences they carried summed.
    counts: (u64, u64),
    /// Whether drafting pays in these batched steps: paused for all requests while steps with
    /// drafts cost more time per generated token than steps without
    /// ([`Engine::draft_payoff`]; the requests' own pacing follows their acceptance only).
    payoff: DraftPacing,
}

impl<'a> Scheduler<'a> {
    /// A scheduler of `parallel` sequences on `engine`, each with its own caches reserved from
    /// the engine's KV budget now (an error when they do not all fit).
    pub fn new(engine: &'a Engine, parallel: usize) -> Result<Scheduler<'a>> {
        if parallel == 0 {
            return Err(Error::InvalidArgument("parallel sequences must be at least 1".into()));
        }
        Self::refuse_predicted_routing(engine, parallel)?;
        let sessions =
            (0..parallel).map(|_| Ok(SlotSession::Own(Box::new(engine.new_session()?)))).collect::<Result<_>>()?;
        Ok(Self::over(engine, sessions))
    }

    /// A scheduler over the caller's `sessions` (of `engine`), one slot each, in order: a
    /// request [`Scheduler::submit_to`] slot `i` continues session `i` as
    /// [`crate::chat::complete`] would (the prefix it shares with the prompt is reused), and
    /// the sessions hold their conversations when the scheduler is dropped.
    pub fn with_sessions(engine: &'a Engine, sessions: Vec<&'a mut Session>) -> Result<Scheduler<'a>> {
        if sessions.is_empty() {
            return Err(Error::InvalidArgument("a scheduler needs at least one session".into()));
        }
        for s in &sessions {
            engine.check_owner(s)?;
        }
        Self::refuse_predicted_routing(engine, sessions.len())?;
        Ok(Self::over(engine, sessions.into_iter().map(SlotSession::Lent).collect()))
    }

    /// Several sequences cannot share steps where the prerouter is the routing (its heads
    /// follow one sequence).
    fn refuse_predicted_routing(engine: &Engine, sequences: usize) -> Result<()> {
        match sequences > 1 && engine.routing == RoutingMode::Predicted {
            true => Err(Error::UnsupportedConfig(
                "parallel sequences with the prerouter as the routing (its heads follow one sequence)".into(),
            )),
            false => Ok(()),
        }
    }

    fn over(engine: &'a Engine, sessions: Vec<SlotSession<'a>>) -> Scheduler<'a> {
        let slots = sessions.into_iter().map(|session| Slot { session, running: None }).collect();
        let payoff = DraftPacing::new(usize::MAX);
        Scheduler { engine, slots, waiting: VecDeque::new(), next_id: 1, ended: Vec::new(), counts: (0, 0), payoff }
    }

    /// Queues a request to generate after `prompt` (the whole sequence: a slot that already
    /// holds a prefix of it prefills only the rest); `on_token` sees each generated token and
    /// may end the request. Refused now when the prompt is empty, out of the vocabulary, over
    /// the context or the sampling values are invalid.
    pub fn submit(&mut self, prompt: Vec<u32>, options: GenerateOptions, on_token: OnToken<'a>) -> Result<RequestId> {
        let mut once = Some(on_token);
        let ids = self.submit_n(prompt, options, 1, |_| once.take().expect("one choice"))?;
        Ok(ids[0])
    }

    /// [`Scheduler::submit`] into slot `slot` (a session lent by [`Scheduler::with_sessions`]
    /// continues there): it waits for that slot.
    pub fn submit_to(
        &mut self,
        slot: usize,
        prompt: Vec<u32>,
        options: GenerateOptions,
        on_token: OnToken<'a>,
    ) -> Result<RequestId> {
        if slot >= self.slots.len() {
            return Err(Error::InvalidArgument(format!("slot {slot} of {}", self.slots.len())));
        }
        let id = self.submit(prompt, options, on_token)?;
        self.waiting.back_mut().expect("just queued").slot = Some(slot);
        Ok(id)
    }

    /// Queues `n` choices of one prompt, like [`Scheduler::submit`]: the prompt is prefilled
    /// once and the choices go on from copies of its caches, choice `i` sampling with the seed
    /// `options`' plus `i` (at temperature 0 they are all the same); `on_token(i)` makes choice
    /// `i`'s callback. They run at once, so `n` must not exceed the scheduler's sequences.
    pub fn submit_n(
        &mut self,
        prompt: Vec<u32>,
        options: GenerateOptions,
        n: usize,
        mut on_token: impl FnMut(usize) -> OnToken<'a>,
    ) -> Result<Vec<RequestId>> {
        options.sampling.validate()?;
        super::generation::check_logprobs(&options)?;
        self.engine.check_prompt(&prompt)?;
        super::generation::validate_drafts(&options, self.engine.routing())?;
        MtpDrafts::validate(self.engine, &options)?;
        if options.prompt_logprobs && n > 1 {
            return Err(Error::UnsupportedConfig("prompt log-probabilities with several choices".into()));
        }
        if n == 0 || n > self.slots.len() {
            return Err(Error::InvalidArgument(format!(
                "{n} choices of one prompt: 1 to {} (the parallel sequences) allowed",
                self.slots.len()
            )));
        }
        let ids: Vec<RequestId> = (0..n as u64).map(|i| self.next_id + i).collect();
        self.next_id += n as u64;
        // Each choice's picker is made now, so a constraint that does not compile is refused here.
        let picker = Picker::new(self.engine, &options)?;
        let siblings = (1..n)
            .map(|i| {
                let mut o = options.clone();
                o.sampling.seed = o.sampling.seed.wrapping_add(i as u64);
                let picker = Picker::new(self.engine, &o)?;
                Ok((ids[i], o, picker, on_token(i)))
            })
            .collect::<Result<_>>()?;
        let on_token = on_token(0);
        self.waiting.push_back(Waiting { id: ids[0], prompt, options, picker, on_token, slot: None, siblings });
        Ok(ids)
    }

    /// Ends request `id` before its next step (its generation so far is reported by the
    /// next [`Scheduler::step`]); `false` when no such request is queued or running.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        let unstarted = |prompt: &[u32]| {
            Ok(Generation {
                prompt_tokens: prompt.to_vec(),
                tokens: Vec::new(),
                text: String::new(),
                logprobs: Vec::new(),
                prompt_logprobs: Vec::new(),
                stats: Stats::default(),
            })
        };
        if let Some(i) = self.waiting.iter().position(|w| w.id == id) {
            // Its first sibling (if any) takes its place in the queue.
            let mut w = self.waiting.remove(i).expect("found above");
            self.ended.push(Finished { id, result: unstarted(&w.prompt) });
            if !w.siblings.is_empty() {
                let (id, options, picker, on_token) = w.siblings.remove(0);
                let next =
                    Waiting { id, prompt: w.prompt, options, picker, on_token, slot: w.slot, siblings: w.siblings };
                self.waiting.insert(i, next);
            }
            return true;
        }
        for w in &mut self.waiting {
            if let Some(j) = w.siblings.iter().position(|s| s.0 == id) {
                drop(w.siblings.remove(j));
                let result = unstarted(&w.prompt);
                self.ended.push(Finished { id, result });
                return true;
            }
        }
        match self.slots.iter_mut().filter_map(|s| s.running.as_mut()).find(|r| r.id == id) {
            Some(r) => {
                r.cancelled = true;
                true
            }
            None => false,
        }
    }

    /// Whether nothing is queued, running or left to report.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.ended.is_empty() && self.slots.iter().all(|s| s.running.is_none())
    }

    /// Steps run so far, and the sequences they carried summed (over the steps: the mean
    /// batch).
    pub fn step_counts(&self) -> (u64, u64) {
        self.counts
    }

    /// Admits what fits, runs one step over every running request and returns those that
    /// ended. A failed step ends every request that took part in it with the error.
    pub fn step(&mut self) -> Result<Vec<Finished>> {
        let started = Instant::now();
        let mut finished = std::mem::take(&mut self.ended);
        for i in 0..self.slots.len() {
            let ended = self.slots[i].running.as_ref().is_some_and(|r| {
                // A choice whose prompt ended before it was forked ends with it.
                let orphan =
                    r.fork_of.is_some_and(|(slot, id)| self.slots[slot].running.as_ref().is_none_or(|p| p.id != id));
                r.cancelled || orphan
            });
            if ended {
                finished.push(self.finish_running(i, Ok(())));
            }
        }
        self.admit()?;
        let (parts, failed, timed) = self.plan();
        for (i, e) in failed {
            finished.push(self.finish_running(i, Err(e)));
        }
        if parts.is_empty() {
            return Ok(finished);
        }
        for p in &parts {
            let (session, prefilling) = (&self.slots[p.slot].session, self.slots[p.slot].running.as_ref());
            if p.end == session.len() && prefilling.is_some_and(|r| r.next.is_none()) {
                // Where the prompt's last chunk starts: a regenerated reply resumes here.
                session.cache.snapshot_states(p.start);
            }
        }
        let phase = if parts.iter().any(|p| p.decode) { Phase::Decode } else { Phase::Prefill };
        self.attribute_rows(&parts);
        // Drafts ride on their sequences for the step (row i's history is the sequence and
        // the first i drafts); a hybrid model keeps each token's states (or saves them first),
        // to be cut back.
        let mut saved = Ok(());
        for p in parts.iter().filter(|p| !p.drafts.is_empty()) {
            let session = &mut self.slots[p.slot].session;
            session.tokens.extend_from_slice(&p.drafts);
            saved = saved.and_then(|()| self.engine.model.prepare_for_drafts(&session.cache, p.rows()));
        }
        let engine = self.engine;
        // The experts drafting sequences' rows are expected to route to are read from now on.
        let drafting = parts.iter().filter(|p| !p.drafts.is_empty() && saved.is_ok()).map(|p| {
            let rows = VerifyRows { pos: p.start, drafts: &p.drafts, copied_from: p.copied_from };
            (&*self.slots[p.slot].session, rows)
        });
        engine.prefetch_for_verify(drafting);
        // Each slot's sequence for the step, and the pickers of constrained requests, apart.
        let mut masking: Vec<&mut Picker> = Vec::new();
        let sessions: Vec<&Session> = (self.slots.iter_mut())
            .map(|Slot { session, running }| {
                masking.extend(running.as_mut().map(|r| &mut r.picker).filter(|p| p.is_constrained()));
                &**session
            })
            .collect();
        // Where each part's rows start among the step's.
        let rows_at: Vec<usize> = (parts.iter())
            .scan(0, |row, p| {
                let at = *row;
                *row += p.rows();
                Some(at)
            })
            .collect();
        let entries: Vec<BatchEntry<'_>> = parts
            .iter()
            .map(|p| {
                let session = sessions[p.slot];
                BatchEntry {
                    cache: &session.cache,
                    tokens: &session.tokens[p.start..p.start + p.rows()],
                    pos: p.start,
                    logits: p.logits,
                }
            })
            .collect();
        // Constrained requests' next masks are computed on another thread while the GPU runs
        // the step. A mask that fails here is computed again when its token is picked, which
        // returns the error to its request alone.
        let run = || saved.and_then(|()| engine.model.step_batch(&entries, phase));
        let outputs = match masking.is_empty() {
            true => run(),
            false => std::thread::scope(|scope| {
                scope.spawn(|| masking.iter_mut().for_each(|picker| drop(picker.prepare_mask())));
                run()
            }),
        };
        drop(entries);
        self.counts = (self.counts.0 + 1, self.counts.1 + parts.len() as u64);
        let outputs = match outputs {
            Ok(o) => o,
            Err(e) => {
                // The first request gets the error; the others that shared the step its text.
                let mut error = Some(e);
                let text = error.as_ref().map(ToString::to_string).unwrap_or_default();
                for p in &parts {
                    let slot = &mut self.slots[p.slot];
                    // The sequence's caches are in an unknown state: it starts again.
                    let len = slot.session.len() - p.drafts.len();
                    slot.session.tokens.truncate(len);
                    slot.session.truncate(0);
                    let e = error.take().unwrap_or_else(|| Error::BatchStepFailed(text.clone()));
                    finished.push(self.finish_running(p.slot, Err(e)));
                }
                return Ok(finished);
            }
        };
        // Every part's routing is remembered before any MTP pass below starts a step of its own
        // (which clears the step's routing); rejected drafts' rows are forgotten as they are.
        for (p, &row) in parts.iter().zip(&rows_at) {
            engine.remember_routing(&mut self.slots[p.slot].session, p.start, (row, p.rows()));
        }
        for (p, &row) in parts.iter().zip(&rows_at) {
            if let Err(e) = self.follow_with_mtp(p, row) {
                finished.push(self.finish_running(p.slot, Err(e)));
            }
        }
        for (p, mut rows) in parts.iter().zip(outputs) {
            if self.slots[p.slot].running.is_none() {
                // Ended by its MTP module's failure above.
                continue;
            }
            if !p.drafts.is_empty() {
                if let Some(done) = self.slots[p.slot].take_drafted(self.engine, p.start, &p.drafts, rows) {
                    finished.push(self.finish_running(p.slot, done));
                }
                continue;
            }
            self.slots[p.slot].session.cached = p.end;
            if p.logits == Rows::All {
                self.take_prompt_logprobs(p, &rows);
            }
            let slot = &self.slots[p.slot];
            let wants_token = slot.running.as_ref().is_some_and(|r| r.options.max_tokens > 0 || r.next.is_some());
            let Some(mut logits) = rows.pop().filter(|_| p.end == slot.session.len() && wants_token) else { continue };
            let ends = self.fork(p.slot, &logits);
            for (i, done) in ends {
                finished.push(self.finish_running(i, done));
            }
            if let Some(done) = self.slots[p.slot].take_token(self.engine, &mut logits) {
                finished.push(self.finish_running(p.slot, done));
            }
        }
        if timed && parts.iter().all(|p| p.decode) {
            // A step of decode tokens only, so that steps with and without drafts compare.
            let drafted = parts.iter().any(|p| !p.drafts.is_empty());
            let tokens = parts.iter().map(|p| self.slots[p.slot].session.len().saturating_sub(p.end)).sum();
            self.payoff.timed(drafted, tokens, started.elapsed().as_secs_f64());
        }
        for i in 0..self.slots.len() {
            // A request wanting no tokens ends once its prompt is in the cache.
            let slot = &self.slots[i];
            let prefilled = slot.session.cached == slot.session.len();
            if slot.running.as_ref().is_some_and(|r| r.options.max_tokens == 0 && r.fork_of.is_none() && prefilled) {
                finished.push(self.finish_running(i, Ok(())));
            }
        }
        Ok(finished)
    }

    /// Tells the MTP module of part `p`'s request (if it drafts from one) that the step just run
    /// left the part's hidden states from row `row`, and runs the module over a prompt chunk
    /// before the last.
    fn follow_with_mtp(&mut self, p: &Part, row: usize) -> Result<()> {
        let Slot { session, running } = &mut self.slots[p.slot];
        let Some(mtp) = running.as_mut().and_then(|r| r.mtp.as_mut()) else { return Ok(()) };
        *mtp = MtpDrafts::after_step(p.start, row);
        match p.drafts.is_empty() {
            true => self.engine.mtp_over_chunk(session, (p.start, p.end), row),
            false => Ok(()),
        }
    }

    /// Records the log-probabilities of the prompt tokens that `rows` (the logits after each
    /// token of part `p`) predict.
    fn take_prompt_logprobs(&mut self, p: &Part, rows: &[Vec<f32>]) {
        let slot = &mut self.slots[p.slot];
        let r = slot.running.as_mut().expect("a step's part belongs to a running request");
        let top = r.options.logprobs.unwrap_or(0);
        for (i, row) in rows.iter().enumerate() {
            if let Some(&next) = slot.session.tokens.get(p.start + i + 1).filter(|_| p.start + i + 1 < r.prompt_len) {
                r.prompt_logprobs.push(token_logprob(row, next, top));
            }
        }
    }

    /// Starts the choices waiting for the request in slot `parent`, whose prompt's `logits`
    /// just arrived: their slots copy its caches and take their first tokens from the logits.
    /// Returns those that ended at once.
    fn fork(&mut self, parent: usize, logits: &[f32]) -> Vec<(usize, Result<()>)> {
        let Some(parent_id) = self.slots[parent].running.as_ref().filter(|r| r.first_token.is_none()).map(|r| r.id)
        else {
            return Vec::new();
        };
        let mut ended = Vec::new();
        for i in 0..self.slots.len() {
            if self.slots[i].running.as_ref().is_none_or(|r| r.fork_of != Some((parent, parent_id))) {
                continue;
            }
            let (from, to) = (&self.slots[parent].session, &self.slots[i].session);
            let copied = self.engine.model.copy_cache(&from.cache, &to.cache);
            let (tokens, routes) = (from.tokens.clone(), from.routes.clone());
            // The copy's MTP module follows the same rows of the step.
            let mtp = self.slots[parent].running.as_ref().and_then(|r| r.mtp);
            let slot = &mut self.slots[i];
            (slot.session.tokens, slot.session.routes) = (tokens, routes);
            slot.session.cached = slot.session.len();
            let r = slot.running.as_mut().expect("checked above");
            r.fork_of = None;
            r.mtp = r.mtp.and(mtp);
            (r.reused, r.prefilled) = (slot.session.len(), 0);
            if let Err(e) = copied {
                ended.push((i, Err(e)));
                continue;
            }
            if let Some(done) = slot.take_token(self.engine, &mut logits.to_vec()) {
                ended.push((i, done));
            }
        }
        ended
    }

    /// Runs steps until every request has ended; returns them in the order they ended.
    pub fn run(&mut self) -> Result<Vec<Finished>> {
        let mut all = Vec::new();
        while !self.is_idle() {
            all.extend(self.step()?);
        }
        Ok(all)
    }

    /// Moves waiting requests into idle slots, each to the one sharing the longest prefix
    /// with its prompt.
    fn admit(&mut self) -> Result<()> {
        let mut busy = self.slots.iter().any(|s| s.running.is_some());
        while let Some(w) = self.waiting.front() {
            let idle = self.slots.iter().filter(|s| s.running.is_none()).count();
            if idle < 1 + w.siblings.len() {
                // First come, first served: later requests wait too.
                break;
            }
            let shared_with = |s: &Slot| s.session.tokens.iter().zip(&w.prompt).take_while(|(a, b)| a == b).count();
            let best = (0..self.slots.len())
                .filter(|&i| self.slots[i].running.is_none() && w.slot.is_none_or(|pinned| pinned == i))
                .map(|i| (shared_with(&self.slots[i]), std::cmp::Reverse(i)))
                .max();
            let Some((shared, std::cmp::Reverse(i))) = best else { break };
            let mut w = self.waiting.pop_front().expect("looked at above");
            let siblings = std::mem::take(&mut w.siblings);
            let slot = &mut self.slots[i];
            // An identical prompt still needs its last token run for the first prediction; a
            // prompt whose log-probabilities are wanted runs whole.
            let keep = match (w.options.prompt_logprobs, shared == w.prompt.len()) {
                (true, _) => 0,
                (false, true) => shared - 1,
                (false, false) => shared,
            };
            slot.session.truncate(keep);
            slot.session.tokens.extend_from_slice(&w.prompt[keep..]);
            self.engine.remember_routing_for(&mut slot.session, &w.options);
            let len = slot.session.len();
            slot.session.cached = slot.session.cache.resume_point(slot.session.cached.min(len - 1));
            let reused = slot.session.cached;
            // The expert cache keeps each request's activation matrix (the trace marks the spell).
            let experts_before = begin_scheduled(self.engine, w.id, !busy)?;
            busy = true;
            let start = |id, options, picker, on_token| {
                Running::new(self.engine, id, w.prompt.len(), (options, picker), on_token, experts_before)
            };
            let mut running = start(w.id, w.options, w.picker, w.on_token);
            (running.reused, running.prefilled) = (reused, len - reused);
            for (id, options, picker, on_token) in siblings {
                let j =
                    (0..self.slots.len()).find(|&j| j != i && self.slots[j].running.is_none()).expect("counted above");
                let before = begin_scheduled(self.engine, id, false)?;
                let sibling = Running {
                    fork_of: Some((i, w.id)),
                    experts_before: before,
                    ..start(id, options, picker, on_token)
                };
                self.slots[j].running = Some(sibling);
            }
            self.slots[i].running = Some(running);
        }
        Ok(())
    }

    /// Ends the request running in slot `i` (`outcome`: fine, or the error it failed with) and
    /// frees the slot, which keeps its sequence for the next request to reuse.
    fn finish_running(&mut self, i: usize, outcome: Result<()>) -> Finished {
        let r = self.slots[i].running.take().expect("a running request");
        let engine = self.engine;
        let experts = end_scheduled(engine, r.id, r.experts_before);
        let slot = &self.slots[i];
        let now = Instant::now();
        let first = r.first_token.unwrap_or(now);
        let prefill_s = first.duration_since(r.admitted).as_secs_f64();
        let decode_steps = r.generated.len().saturating_sub(1);
        let decode_s = now.duration_since(first).as_secs_f64();
        let prompt_end = r.prompt_len.min(slot.session.len());
        let mut logprobs = r.picker.logprobs;
        logprobs.truncate(r.generated.len());
        let result = outcome.map(|()| Generation {
            prompt_tokens: slot.session.tokens[..prompt_end].to_vec(),
            tokens: r.generated,
            text: r.text,
            logprobs,
            prompt_logprobs: r.prompt_logprobs,
            stats: engine.request_stats(RequestFigures {
                prefilled: r.prefilled,
                reused: r.reused,
                prefill_s,
                decode_steps,
                decode_s,
                // Steps are shared: their waits are no one request's.
                decode_waits: 0.0,
                drafted: r.drafted,
                experts,
            }),
        });
        Finished { id: r.id, result }
    }
}
