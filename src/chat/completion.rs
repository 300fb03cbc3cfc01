//! One reply: generation that ends at end-of-turn tokens, stop strings, the token limit or the
//! caller's cancellation, streaming only the text that is certain to be kept.

use serde::Serialize;

use super::stop::StopScanner;
use crate::error::Result;
use crate::runtime::{Engine, GenerateOptions, Generation, Session};

/// How to generate one reply.
#[derive(Clone, Debug, Default)]
pub struct CompletionRequest {
    /// Token limit and sampling.
    pub options: GenerateOptions,
    /// Tokens that end the turn (see [`super::end_of_turn_tokens`]); the one met joins the
    /// generated tokens but adds no text.
    pub stop_tokens: Vec<u32>,
    /// Strings that end the reply; the text stops before the first one found.
    pub stop_strings: Vec<String>,
}

/// Why a reply ended (the OpenAI API's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-turn token or a stop string.
    Stop,
    /// The token limit or the end of the context.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
}

/// A finished reply.
#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    /// The reply's text, without stop strings.
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// The engine's generation: the whole prompt's and the generated token ids, speed,
    /// prefilled and reused token counts, expert-cache figures.
    pub generation: Generation,
}

/// One reply's text as its tokens arrive: end-of-turn tokens and stop strings end it, and only
/// text certain to be kept is passed on. [`complete`] runs one through `generate_in`; `serve`
/// runs one per request through the runtime's scheduler.
pub struct Reply {
    stop_tokens: Vec<u32>,
    scanner: StopScanner,
    text: String,
    finish: Option<FinishReason>,
}

impl Reply {
    /// A reply to `request`.
    pub fn new(request: &CompletionRequest) -> Reply {
        Reply {
            stop_tokens: request.stop_tokens.clone(),
            scanner: StopScanner::new(&request.stop_strings),
            text: String::new(),
            finish: None,
        }
    }

    /// Takes generated token `id` and its text `piece`, calling `on_text` with the text now
    /// certain (it returns `false` to cancel); `false` when the reply has ended.
    pub fn token(&mut self, id: u32, piece: &str, mut on_text: impl FnMut(&str) -> bool) -> bool {
        if self.stop_tokens.contains(&id) {
            self.finish = Some(FinishReason::Stop);
            return false;
        }
        let safe = self.scanner.push(piece);
        self.text.push_str(&safe);
        if !safe.is_empty() && !on_text(&safe) {
            self.finish = Some(FinishReason::Cancelled);
            return false;
        }
        if self.scanner.stopped() {
            self.finish = Some(FinishReason::Stop);
            return false;
        }
        true
    }

    /// Ends the reply after `generation` of `request` (whose whole prompt is
    /// `generation.prompt_tokens`) in a context of `context` positions, passing any text held
    /// back to `on_text`.
    pub fn finish(
        mut self,
        generation: Generation,
        request: &CompletionRequest,
        context: usize,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Completion {
        let finish_reason = match self.finish {
            Some(f) => f,
            None => {
                let rest = self.scanner.finish();
                self.text.push_str(&rest);
                if !rest.is_empty() {
                    on_text(&rest);
                }
                // The engine ends silently at the model's end-of-sequence tokens.
                let len = generation.prompt_tokens.len() + generation.tokens.len();
                let ended_by_eos = generation.tokens.len() < request.options.max_tokens && len < context;
                if ended_by_eos {
                    FinishReason::Stop
                } else {
                    FinishReason::Length
                }
            }
        };
        Completion { text: self.text, finish_reason, generation }
    }
}

/// Generates after `prompt` in `session`, calling `on_text` with each piece of text as it
/// becomes certain; `on_text` returns `false` to stop (the reply then ends as
/// [`FinishReason::Cancelled`]).
///
/// The session keeps the longest prefix it shares with `prompt` (a conversation's earlier turns,
/// the previous reply included) and only the rest is prefilled; afterwards it holds `prompt` and
/// the reply. This is the single place `chat` and the C ABI run a reply through.
pub fn complete(
    engine: &Engine,
    session: &mut Session,
    prompt: &[u32],
    request: &CompletionRequest,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Completion> {
    let shared = session.tokens().iter().zip(prompt).take_while(|(a, b)| a == b).count();
    // An identical prompt still needs its last token run for the first prediction.
    let keep = if shared == prompt.len() { shared.saturating_sub(1) } else { shared };
    session.truncate(keep);
    let mut reply = Reply::new(request);
    let mut generation = engine
        .generate_in(session, &prompt[keep..], &request.options, |id, piece| reply.token(id, piece, &mut on_text))?;
    generation.prompt_tokens = prompt.to_vec();
    Ok(reply.finish(generation, request, engine.context(), on_text))
}
