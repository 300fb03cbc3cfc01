//! One reply: generation that ends at end-of-turn tokens, stop strings, the token limit or the
//! caller's cancellation, streaming only the text that is certain to be kept.

use serde::Serialize;

use super::stop::StopScanner;
use crate::error::Result;
use crate::runtime::{Engine, GenerateOptions, Generation};

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
    /// The engine's generation: prompt and generated token ids, speed and expert-cache figures.
    pub generation: Generation,
}

/// Generates after `prompt`, calling `on_text` with each piece of text as it becomes certain;
/// `on_text` returns `false` to stop (the reply then ends as [`FinishReason::Cancelled`]).
///
/// This is the single place `chat`, `serve` and the C ABI run a reply through.
pub fn complete(
    engine: &Engine,
    prompt: &[u32],
    request: &CompletionRequest,
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<Completion> {
    let mut scanner = StopScanner::new(&request.stop_strings);
    let mut text = String::new();
    let mut finish = None;
    let generation = engine.generate(prompt, &request.options, |id, piece| {
        if request.stop_tokens.contains(&id) {
            finish = Some(FinishReason::Stop);
            return false;
        }
        let safe = scanner.push(piece);
        text.push_str(&safe);
        if !safe.is_empty() && !on_text(&safe) {
            finish = Some(FinishReason::Cancelled);
            return false;
        }
        if scanner.stopped() {
            finish = Some(FinishReason::Stop);
            return false;
        }
        true
    })?;
    let finish_reason = match finish {
        Some(f) => f,
        None => {
            let rest = scanner.finish();
            text.push_str(&rest);
            if !rest.is_empty() {
                on_text(&rest);
            }
            // The engine ends silently at the model's end-of-sequence tokens.
            let ended_by_eos = generation.tokens.len() < request.options.max_tokens
                && generation.prompt_tokens.len() + generation.tokens.len() < engine.context();
            if ended_by_eos {
                FinishReason::Stop
            } else {
                FinishReason::Length
            }
        }
    };
    Ok(Completion { text, finish_reason, generation })
}
