//! Generating on an [`Engine`]: the default session or a caller's [`Session`],
//! prefill of what a session's cache does not hold yet, then one-token decode steps.

use std::collections::VecDeque;
use std::time::Instant;

use serde::Serialize;

use super::draft_prefetch::VerifyRows;
use super::mtp_drafts::MtpDrafts;
use crate::decoder::{ChainedStep, RoutingMode, StepOutput, StepResult};
use crate::error::{Error, Result};
use crate::experts::policy::Phase;
use crate::experts::residency::ExpertStats;
use crate::runtime::constraint::ConstraintState;
use crate::runtime::drafts::DraftCounts;
use crate::runtime::logprobs::{token_logprob, TokenLogprob, MAX_TOP_LOGPROBS};
use crate::runtime::sampler::Sampler;
use crate::runtime::session::Session;
use crate::runtime::stats::Stats;
use crate::runtime::tokenizer::TextStream;
use crate::util::peak_rss::peak_rss_bytes;

use super::Engine;
use crate::runtime::options::GenerateOptions;

/// What one request did, for its [`Stats`] ([`Engine::request_stats`]).
pub(super) struct RequestFigures {
    /// Positions prefilled, and those reused from the cache.
    pub(super) prefilled: usize,
    pub(super) reused: usize,
    /// Seconds from the request's start to its first token.
    pub(super) prefill_s: f64,
    /// Decode steps after the first token, the seconds they took and the GPU waits in them.
    pub(super) decode_steps: usize,
    pub(super) decode_s: f64,
    pub(super) decode_waits: f64,
    /// Drafts proposed, accepted and the steps that verified them.
    pub(super) drafted: DraftCounts,
    pub(super) experts: ExpertStats,
}

/// A request's token choice: its sampler, and the log-probabilities of what it picks when they
/// were asked for.
pub(super) struct Picker {
    sampler: Sampler,
    top: Option<usize>,
    pub(super) logprobs: Vec<TokenLogprob>,
    /// Where the request is in its constraint's grammar.
    constraint: Option<ConstraintState>,
}

impl Picker {
    /// The picker of a request with `options` on `engine` (a constraint that does not compile
    /// is an error).
    pub(super) fn new(engine: &Engine, options: &GenerateOptions) -> Result<Picker> {
        let constraint = match &options.constraint {
            None => None,
            Some(c) => {
                let mut stops = engine.spec().eos_token_ids.clone();
                stops.extend(&options.end_tokens);
                Some(engine.grammars()?.start(c, &stops)?)
            }
        };
        Ok(Picker { sampler: Sampler::new(options.sampling), top: options.logprobs, logprobs: Vec::new(), constraint })
    }

    /// The token after `logits` (`history` the sequence so far), drawn as [`Sampler::sample`]
    /// draws among what the constraint allows; its log-probability (before the constraint)
    /// recorded when asked for.
    pub(super) fn pick(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32> {
        let raw = self.top.map(|_| logits.to_vec());
        if let Some(c) = &mut self.constraint {
            c.mask(logits)?;
        }
        let token = self.sampler.sample(logits, history);
        if let Some(c) = &mut self.constraint {
            c.accept(token)?;
        }
        if let (Some(raw), Some(top)) = (raw, self.top) {
            self.logprobs.push(token_logprob(&raw, token, top));
        }
        Ok(token)
    }

    /// Walks the logits `rows` of a step that ran the last token of `tokens[..len]` and the
    /// drafts `tokens[len..]` after it, picking each row's token with the draft that follows as
    /// its proposal: how many drafts were accepted, and the token after them (the first
    /// rejected draft's replacement, or the last row's token).
    pub(super) fn walk_drafts(&mut self, rows: Vec<Vec<f32>>, tokens: &[u32], len: usize) -> Result<(usize, u32)> {
        for (i, mut logits) in rows.into_iter().enumerate() {
            // Each row's token is drawn as one token a step draws it (under the same key): a
            // draft is accepted when the draw is it, and sampled text is
            // token for token the text without drafts.
            let draft = tokens.get(len + i).copied();
            let token = self.pick(&mut logits, &tokens[..len + i])?;
            if draft != Some(token) {
                return Ok((i, token));
            }
        }
        unreachable!("the last row has no draft, so it always decides")
    }

    /// The keys of this picker's next `n` draws and its temperature, for sampled MTP drafts
    /// (`None` where it picks greedily).
    pub(super) fn upcoming_noise(&self, n: usize) -> Option<(Vec<u64>, f32)> {
        let keys = self.sampler.upcoming_keys(n);
        (!keys.is_empty()).then(|| (keys, self.sampler.params().temperature))
    }

    /// Whether a constraint shapes this request's tokens.
    pub(super) fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Computes the constraint's mask for the next pick now, as [`Picker::while_masking`] does
    /// beside a step (the scheduler's batched steps call it on another thread); nothing without
    /// a constraint.
    pub(super) fn prepare_mask(&mut self) -> Result<()> {
        match &mut self.constraint {
            Some(c) => c.prepare(),
            None => Ok(()),
        }
    }

    /// Runs `step` (a GPU step whose logits this picker takes next) while the constraint's mask
    /// for them is computed on another thread.
    pub(super) fn while_masking<T>(&mut self, step: impl FnOnce() -> T) -> Result<T> {
        let Some(c) = &mut self.constraint else { return Ok(step()) };
        std::thread::scope(|s| {
            let masking = s.spawn(|| c.prepare());
            let out = step();
            masking
                .join()
                .map_err(|_| Error::InvalidArgument("constrained decoding: the mask thread panicked".into()))??;
            Ok(out)
        })
    }
}

/// A finished generation.
#[derive(Clone, Debug, Serialize)]
pub struct Generation {
    /// The prompt's token ids.
    pub prompt_tokens: Vec<u32>,
    /// The generated ids.
    pub tokens: Vec<u32>,
    /// The generated text (empty without a tokenizer).
    pub text: String,
    /// Each generated token's log-probability and the most likely alternatives', when
    /// [`GenerateOptions::logprobs`] asked for them.
    pub logprobs: Vec<crate::runtime::logprobs::TokenLogprob>,
    /// The prompt's tokens after the first with their log-probabilities, when
    /// [`GenerateOptions::prompt_logprobs`] asked for them.
    pub prompt_logprobs: Vec<crate::runtime::logprobs::TokenLogprob>,
    /// Speed and memory.
    pub stats: Stats,
}

/// Why drafts and a constraint do not run together.
pub const DRAFTS_WITH_A_CONSTRAINT: &str = "drafts with a constraint (JSON schema, regex, grammar)";

/// Why drafts and predicted routing do not run together.
pub const DRAFTS_WITH_PREDICTED_ROUTING: &str = "drafts with --routing predicted (a verify step routes its \
     tokens natively, so the output would not be the one-token-a-step output); use --speculative off";

/// Refuses prompt-lookup drafts of sizes out of range, and drafts of either kind with a
/// constraint or under predicted `routing`.
pub(super) fn validate_drafts(options: &GenerateOptions, routing: RoutingMode) -> Result<()> {
    if let Some(d) = &options.drafts {
        d.validate()?;
    }
    let drafts = options.drafts.is_some() || options.mtp_drafts > 0;
    if drafts && options.constraint.is_some() {
        return Err(Error::UnsupportedConfig(DRAFTS_WITH_A_CONSTRAINT.into()));
    }
    if drafts && routing == RoutingMode::Predicted {
        return Err(Error::UnsupportedConfig(DRAFTS_WITH_PREDICTED_ROUTING.into()));
    }
    Ok(())
}

/// Refuses more top log-probabilities than [`MAX_TOP_LOGPROBS`].
pub(super) fn check_logprobs(options: &GenerateOptions) -> Result<()> {
    match options.logprobs {
        Some(n) if n > MAX_TOP_LOGPROBS => {
            Err(Error::InvalidArgument(format!("{n} top log-probabilities per token: at most {MAX_TOP_LOGPROBS}")))
        }
        _ => Ok(()),
    }
}

impl Engine {
    pub(super) fn check_prompt(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.check_tokens(tokens, 0)
    }

    /// Checks that `tokens` are in the vocabulary and fit after `before` positions.
    pub(super) fn check_tokens(&self, tokens: &[u32], before: usize) -> Result<()> {
        if before + tokens.len() > self.context() {
            return Err(Error::ContextOverflow { requested: before + tokens.len(), context: self.context() });
        }
        let vocab = self.spec().vocab;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(&id) => Err(Error::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }

    /// Runs `f` on the default session, emptied first.
    pub(super) fn with_default_session<T>(&self, f: impl FnOnce(&mut Session) -> Result<T>) -> Result<T> {
        let mut slot = self.default_session.lock().expect("default session lock");
        if slot.is_none() {
            *slot = Some(self.new_session()?);
        }
        let session = slot.as_mut().expect("made above");
        session.truncate(0);
        f(session)
    }

    /// Brings `session`'s cache up to its whole sequence, in steps of at most `max_batch`
    /// tokens; the last step produces `last`. The last token is run again when the cache
    /// already holds everything (its output is needed). With `mtp`, the MTP module runs over
    /// every chunk but the last; returns where that last one started.
    pub(super) fn prefill(
        &self,
        session: &mut Session,
        last: StepOutput<'_>,
        mtp: bool,
    ) -> Result<(StepResult, usize)> {
        self.check_owner(session)?;
        let b = self.model.options().max_batch;
        let len = session.tokens.len();
        session.cached = session.cache.resume_point(session.cached.min(len - 1));
        let (mut result, mut last_start) = (StepResult::None, session.cached);
        while session.cached < len {
            let start = session.cached;
            last_start = start;
            let end = (start + b).min(len);
            let output = if end == len { last } else { StepOutput::None };
            if end == len {
                // Where the prompt's last chunk starts: a regenerated reply resumes here.
                session.cache.snapshot_states(start);
            }
            result = self.model.step(&session.cache, &session.tokens[start..end], start, Phase::Prefill, output)?;
            self.remember_routing(session, start, (0, end - start));
            if mtp {
                self.mtp_over_chunk(session, (start, end), 0)?;
            }
            session.cached = end;
        }
        Ok((result, last_start))
    }

    /// Refuses a session made by another engine (its caches are bound to that engine's model).
    pub(super) fn check_owner(&self, session: &Session) -> Result<()> {
        match self.model.owns(&session.cache) {
            true => Ok(()),
            false => Err(Error::InvalidArgument("the session belongs to another engine".into())),
        }
    }

    /// Generates after `prompt`, calling `on_token(id, text_piece)` for each new token; the
    /// callback returns `false` to stop early (cancellation). Each call starts a new sequence.
    pub fn generate(
        &self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: impl FnMut(u32, &str) -> bool,
    ) -> Result<Generation> {
        self.check_prompt(prompt)?;
        self.with_default_session(|s| self.generate_in(s, prompt, options, on_token))
    }

    /// Appends `new_tokens` to `session` and generates after them, like [`Engine::generate`]:
    /// only what the session's cache does not hold yet is prefilled, and the generated tokens
    /// become part of the session (the next call appends after them).
    pub fn generate_in(
        &self,
        session: &mut Session,
        new_tokens: &[u32],
        options: &GenerateOptions,
        mut on_token: impl FnMut(u32, &str) -> bool,
    ) -> Result<Generation> {
        self.check_owner(session)?;
        options.sampling.validate()?;
        validate_drafts(options, self.routing)?;
        MtpDrafts::validate(self, options)?;
        check_logprobs(options)?;
        if options.prompt_logprobs {
            return Err(Error::UnsupportedConfig("prompt log-probabilities outside the scheduler".into()));
        }
        if session.is_empty() && new_tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.check_tokens(new_tokens, session.len())?;
        session.tokens.extend_from_slice(new_tokens);
        self.remember_routing_for(session, options);
        let before = self.begin_request()?;
        // Log-probabilities need the logits on the CPU.
        let greedy = options.sampling.argmax_on_gpu() && options.logprobs.is_none() && options.constraint.is_none();
        let want = if greedy { StepOutput::Argmax } else { StepOutput::Logits };
        let mut picker = Picker::new(self, options)?;
        let pick = |r: StepResult, history: &[u32], picker: &mut Picker| match r {
            StepResult::Token(t) => Ok(t),
            StepResult::Logits(mut l) => picker.pick(&mut l, history),
            _ => unreachable!("generate asks for a token or logits"),
        };
        let mut stream = self.tokenizer.as_ref().map(TextStream::new);
        let mut text = String::new();
        let mut tokens = Vec::new();
        session.cached = session.cache.resume_point(session.cached.min(session.len() - 1));
        let reused = session.cached;
        let started = Instant::now();
        let output = if options.max_tokens > 0 { want } else { StepOutput::None };
        let (first, last_chunk) = self.prefill(session, output, options.mtp_drafts > 0)?;
        let mut mtp = (options.mtp_drafts > 0).then(|| MtpDrafts::after_step(last_chunk, 0));
        // Tokens decided and not yet taken: the next one, or accepted drafts and the token after.
        let mut queue: VecDeque<u32> = VecDeque::new();
        if options.max_tokens > 0 {
            queue.push_back(pick(first, &session.tokens, &mut picker)?);
        }
        let mut drafted = DraftCounts::new(options, self.draft_payoff());
        let prefill_s = started.elapsed().as_secs_f64();
        let prefilled = session.len() - reused;
        let decode_start = Instant::now();
        let waits_before = self.gpu().waits();
        let eos = &self.spec().eos_token_ids;
        let chained = greedy && self.chains_decode() && options.drafts.is_none() && mtp.is_none();
        // With chained steps: the step of the last token pushed, submitted before that token
        // was read (dropped unread when generation ends first).
        let mut ahead: Option<ChainedStep<'_>> = None;
        while let Some(t) = queue.pop_front() {
            if !options.ignore_eos && eos.contains(&t) {
                break;
            }
            tokens.push(t);
            session.tokens.push(t);
            let piece = match stream.as_mut() {
                Some(s) => s.push(t)?,
                None => String::new(),
            };
            text.push_str(&piece);
            let pos = session.len() - 1;
            if !on_token(t, &piece) || tokens.len() >= options.max_tokens || pos + 1 > self.context() {
                break;
            }
            if !queue.is_empty() {
                // An accepted draft: its step has run.
                continue;
            }
            let room =
                (options.max_tokens - tokens.len()).min(self.context() - pos).min(self.model.options().max_batch);
            let allowance = (room - 1).min(drafted.allowance());
            let step_started = Instant::now();
            let (draft, copied_from) = match mtp.as_mut() {
                Some(m) if allowance > 0 => (m.catch_up(self, session, (pos, allowance), &picker)?, None),
                // Not drafting at this step: the module skips these positions.
                Some(m) => {
                    m.skip_to(pos);
                    (Vec::new(), None)
                }
                None => {
                    let (draft, from) = options.drafts.map(|d| d.draft(&session.tokens, allowance)).unwrap_or_default();
                    (draft, Some(from))
                }
            };
            if !draft.is_empty() {
                self.prefetch_for_verify([(&*session, VerifyRows { pos, drafts: &draft, copied_from })]);
                let (accepted, after) = self.verify_drafts(session, &draft, pos, &mut picker)?;
                drafted.count(draft.len(), accepted);
                drafted.timed(true, accepted + 1, step_started.elapsed().as_secs_f64());
                queue.extend(&draft[..accepted]);
                queue.push_back(after);
                continue;
            }
            queue.push_back(match chained {
                false => {
                    let step =
                        picker.while_masking(|| self.model.step(&session.cache, &[t], pos, Phase::Decode, want))?;
                    let step = step?;
                    self.remember_routing(session, pos, (0, 1));
                    pick(step, &session.tokens, &mut picker)?
                }
                true => {
                    let current = match ahead.take() {
                        Some(step) => step,
                        None => self.model.submit_chained(&session.cache, Some(t), pos)?,
                    };
                    debug_assert_eq!(current.position(), pos);
                    // The step after it takes its token on the GPU, unless that token will be
                    // the last one wanted (then no step runs on it).
                    if tokens.len() + 1 < options.max_tokens && pos + 2 <= self.context() {
                        ahead = Some(self.model.submit_chained(&session.cache, None, pos + 1)?);
                    }
                    current.finish()?
                }
            });
            session.cached = pos + 1;
            drafted.timed(false, 1, step_started.elapsed().as_secs_f64());
        }
        // Accepted drafts left untaken (the reply ended first) are not part of the sequence.
        session.cached = session.cached.min(session.len());
        session.forget_routes_from(session.len());
        // A step run on a token that ended the reply is waited for, and counted.
        drop(ahead);
        let decode_s = decode_start.elapsed().as_secs_f64();
        let decode_steps = tokens.len().saturating_sub(1);
        let decode_waits = (self.gpu().waits() - waits_before) as f64;
        let experts = self.end_request(before);
        // Tokens decided but not taken (an end-of-sequence token, drafts after the end) have
        // no place in the reply.
        let mut logprobs = picker.logprobs;
        logprobs.truncate(tokens.len());
        Ok(Generation {
            prompt_tokens: new_tokens.to_vec(),
            tokens,
            text,
            logprobs,
            prompt_logprobs: Vec::new(),
            stats: self.request_stats(RequestFigures {
                prefilled,
                reused,
                prefill_s,
                decode_steps,
                decode_s,
                decode_waits,
                drafted,
                experts,
            }),
        })
    }

    /// A request's [`Stats`]: its `figures` and the engine's.
    pub(super) fn request_stats(&self, figures: RequestFigures) -> Stats {
        let RequestFigures { prefilled, reused, prefill_s, decode_steps, decode_s, decode_waits, drafted, experts } =
            figures;
        let per_step = |x: f64| if decode_steps > 0 { x / decode_steps as f64 } else { 0.0 };
        Stats {
            prefill_tokens_per_s: prefilled as f64 / prefill_s.max(1e-9),
            decode_tokens_per_s: if decode_steps > 0 { decode_steps as f64 / decode_s.max(1e-9) } else { 0.0 },
            decode_waits_per_token: per_step(decode_waits),
            prefilled_tokens: prefilled,
            reused_tokens: reused,
            draft_tokens: drafted.proposed,
            accepted_draft_tokens: drafted.accepted,
            draft_steps: drafted.steps,
            context: self.context(),
            kv_bytes_per_token: self.kv.bytes_per_token,
            kv_dtype: self.kv_dtype().name(),
            peak_rss_bytes: peak_rss_bytes(),
            gpu_bytes: self.gpu().bytes_allocated(),
            experts,
        }
    }

    /// Runs the last token of `session` (at `pos`) and `draft` after it in one step and
    /// verifies the drafts in order with `picker`: returns how many were accepted and the token
    /// after them (the first rejected draft's replacement, or the token after them all). The
    /// session's cache then holds the last token and the accepted drafts.
    fn verify_drafts(
        &self,
        session: &mut Session,
        draft: &[u32],
        pos: usize,
        picker: &mut Picker,
    ) -> Result<(usize, u32)> {
        // The drafts ride on the sequence while they are checked (row i's history is the
        // sequence and the first i drafts), then come off: the caller takes those accepted.
        let len = session.tokens.len();
        session.tokens.extend_from_slice(draft);
        let checked = self.check_drafts(session, pos, len, picker);
        session.tokens.truncate(len);
        let (accepted, after) = checked?;
        session.cached = pos + 1 + accepted;
        // The kept rows' routing (that of a step over them alone, where the cut ran them again).
        self.remember_routing(session, pos, (0, 1 + accepted));
        Ok((accepted, after))
    }

    /// Runs `session.tokens[pos..]` (the last token of the first `len` and the drafts after
    /// them) in one step and walks the rows with `picker`, then cuts the step back to what was
    /// accepted: the number of drafts accepted and the token after them.
    fn check_drafts(&self, session: &Session, pos: usize, len: usize, picker: &mut Picker) -> Result<(usize, u32)> {
        let run = &session.tokens[pos..];
        let rows = self.model.step_drafted(&session.cache, run, pos)?;
        let (accepted, after) = picker.walk_drafts(rows, &session.tokens, len)?;
        self.model.keep_drafted(&session.cache, run, pos, 1 + accepted)?;
        Ok((accepted, after))
    }

    /// Marks a request's start for the expert cache and trace; returns the figures so far.
    pub(super) fn begin_request(&self) -> Result<ExpertStats> {
        match self.model.residency() {
            Some(mut r) => {
                r.begin_request()?;
                Ok(r.stats())
            }
            None => Ok(ExpertStats::default()),
        }
    }

    /// Marks the request's end; returns its expert figures.
    pub(super) fn end_request(&self, before: ExpertStats) -> ExpertStats {
        match self.model.residency() {
            Some(mut r) => {
                r.end_request();
                r.stats().since(&before)
            }
            None => ExpertStats::default(),
        }
    }
}
