//! A scheduler's slots: each holds a sequence (its own or a caller's) and the request running
//! in it, with what that request has produced so far.

use std::time::Instant;

use super::{OnToken, RequestId};
use crate::error::Result;
use crate::experts::residency::ExpertStats;
use crate::runtime::drafts::DraftCounts;
use crate::runtime::engine::generation::Picker;
use crate::runtime::engine::mtp_drafts::MtpDrafts;
use crate::runtime::engine::{Engine, GenerateOptions};
use crate::runtime::logprobs::TokenLogprob;
use crate::runtime::session::Session;
use crate::runtime::tokenizer::TextStream;

/// A request holding a slot.
pub(super) struct Running<'a> {
    pub(super) id: RequestId,
    pub(super) prompt_len: usize,
    pub(super) options: GenerateOptions,
    pub(super) on_token: OnToken<'a>,
    pub(super) picker: Picker,
    pub(super) stream: Option<TextStream<'a>>,
    pub(super) generated: Vec<u32>,
    pub(super) text: String,
    /// The last generated token, to run in the next step.
    pub(super) next: Option<u32>,
    pub(super) reused: usize,
    pub(super) prefilled: usize,
    pub(super) admitted: Instant,
    pub(super) first_token: Option<Instant>,
    pub(super) experts_before: ExpertStats,
    pub(super) cancelled: bool,
    /// The slot and request this one forks from when its prompt's logits arrive (until then
    /// its slot only waits).
    pub(super) fork_of: Option<(usize, RequestId)>,
    /// The prompt's tokens' log-probabilities so far (with `prompt_logprobs`).
    pub(super) prompt_logprobs: Vec<TokenLogprob>,
    /// Its drafts so far, and how many it proposes next.
    pub(super) drafted: DraftCounts,
    /// Where its MTP module stands, when it drafts from it.
    pub(super) mtp: Option<MtpDrafts>,
}

impl<'a> Running<'a> {
    /// Request `id` (a prompt of `prompt_len` tokens) admitted now, the expert figures at its
    /// start `experts_before`.
    pub(super) fn new(
        engine: &'a Engine,
        id: RequestId,
        prompt_len: usize,
        (options, picker): (GenerateOptions, Picker),
        on_token: OnToken<'a>,
        experts_before: ExpertStats,
    ) -> Running<'a> {
        // Batched steps carry other requests' tokens: their time says nothing of this one's drafts.
        let drafted = DraftCounts::new(&options, false);
        // Placed by its first step (every request runs at least one token of its prompt).
        let mtp = (options.mtp_drafts > 0).then(|| MtpDrafts::after_step(0, 0));
        Running {
            id,
            prompt_len,
            options,
            on_token,
            picker,
            stream: engine.tokenizer.as_ref().map(TextStream::new),
            generated: Vec::new(),
            text: String::new(),
            next: None,
            reused: 0,
            prefilled: 0,
            admitted: Instant::now(),
            first_token: None,
            experts_before,
            cancelled: false,
            fork_of: None,
            prompt_logprobs: Vec::new(),
            drafted,
            mtp,
        }
    }
}

/// A slot's sequence: the scheduler's own, or one its caller lent it
/// ([`Scheduler::with_sessions`]).
pub(super) enum SlotSession<'a> {
    Own(Box<Session>),
    Lent(&'a mut Session),
}

impl std::ops::Deref for SlotSession<'_> {
    type Target = Session;
    fn deref(&self) -> &Session {
        match self {
            SlotSession::Own(s) => s,
            SlotSession::Lent(s) => s,
        }
    }
}

impl std::ops::DerefMut for SlotSession<'_> {
    fn deref_mut(&mut self) -> &mut Session {
        match self {
            SlotSession::Own(s) => s,
            SlotSession::Lent(s) => s,
        }
    }
}

/// One of the scheduler's sequences.
pub(super) struct Slot<'a> {
    pub(super) session: SlotSession<'a>,
    pub(super) running: Option<Running<'a>>,
}

impl Slot<'_> {
    /// Takes the token sampled from `logits` for the request running in `slot`, as
    /// [`Engine::generate_in`] does: `Some` with how the request ended, or `None` when it goes
    /// on (the token runs in the next step).
    pub(super) fn take_token(&mut self, engine: &Engine, logits: &mut [f32]) -> Option<Result<()>> {
        let r = self.running.as_mut().expect("a step's part belongs to a running request");
        match r.picker.pick(logits, &self.session.tokens) {
            Ok(t) => self.take(engine, t),
            Err(e) => Some(Err(e)),
        }
    }

    /// Verifies the `drafts` that rode on the sequence's last step after its last token, at
    /// `pos` (`rows`: the logits after that token and after each draft), as
    /// [`Engine::generate_in`] does: takes the accepted drafts and the token after them, and
    /// cuts the step back to what was accepted. `Some` when the request ended.
    pub(super) fn take_drafted(
        &mut self,
        engine: &Engine,
        pos: usize,
        drafts: &[u32],
        rows: Vec<Vec<f32>>,
    ) -> Option<Result<()>> {
        let r = self.running.as_mut().expect("a step's part belongs to a running request");
        let session = &mut self.session;
        let len = session.len() - drafts.len();
        let (accepted, after) = match r.picker.walk_drafts(rows, &session.tokens, len) {
            Ok(walked) => walked,
            Err(e) => return Some(Err(e)),
        };
        r.drafted.count(drafts.len(), accepted);
        let kept = engine.model.keep_drafted(&session.cache, &session.tokens[pos..], pos, 1 + accepted);
        session.tokens.truncate(len);
        session.cached = pos + 1 + accepted;
        session.forget_routes_from(pos + 1 + accepted);
        if let Err(e) = kept {
            // The sequence's states are in an unknown state: it starts again.
            session.truncate(0);
            return Some(Err(e));
        }
        for &t in drafts[..accepted].iter().chain([&after]) {
            if let Some(done) = self.take(engine, t) {
                // Accepted drafts left untaken are not part of the sequence.
                self.session.cached = self.session.cached.min(self.session.len());
                let len = self.session.len();
                self.session.forget_routes_from(len);
                return Some(done);
            }
        }
        None
    }

    /// Takes token `t` for the request running here: `Some` with how the request ended, or
    /// `None` when it goes on (the token runs in the next step, unless its step has run).
    fn take(&mut self, engine: &Engine, t: u32) -> Option<Result<()>> {
        let r = self.running.as_mut().expect("a step's part belongs to a running request");
        let session = &mut self.session;
        r.first_token.get_or_insert_with(Instant::now);
        r.next = None;
        if !r.options.ignore_eos && engine.spec().eos_token_ids.contains(&t) {
            return Some(Ok(()));
        }
        r.generated.push(t);
        session.tokens.push(t);
        let piece = match r.stream.as_mut().map(|s| s.push(t)).transpose() {
            Ok(p) => p.unwrap_or_default(),
            Err(e) => return Some(Err(e)),
        };
        r.text.push_str(&piece);
        // One pick per token taken (a draft's own, or this token's).
        if !(r.on_token)(t, &piece, r.picker.logprobs.get(r.generated.len() - 1))
            || r.generated.len() >= r.options.max_tokens
            || session.len() > engine.context()
        {
            return Some(Ok(()));
        }
        r.next = Some(t);
        None
    }
}
