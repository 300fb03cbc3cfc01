//! One reply: generation that ends at end-of-turn tokens, stop strings, the token limit or the
//! caller's cancellation, streaming only the text that is certain to be kept.

use serde::Serialize;

use super::forced_calls::token_or_text;
use super::harmony::{HarmonyScanner, HARMONY_MARKERS};
use super::reasoning::{Part, ReasoningScanner, CLOSE as THINK_CLOSE, THINK_MARKERS};
use super::stop::StopScanner;
use super::tool_calls::{ToolCall, ToolCallScanner, ToolFormat};
use super::tool_markers::marker_tokens;
use crate::error::Result;
use crate::runtime::tokenizer::Tokenizer;
use crate::runtime::{Constraint, Engine, GenerateOptions, Generation, Session};

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
    /// Parse tool calls written in this format out of the reply (`None`: all text).
    pub tool_format: Option<ToolFormat>,
    /// Special tokens whose own text the reply reads in their place (the detokenizer drops
    /// them): the tool format's markers ([`ToolFormat::marker_tokens`]).
    pub markers: Vec<(u32, String)>,
    /// Keep `<think>` reasoning apart from the content: `Some(inside)`, `inside` when the
    /// prompt leaves the reply inside the reasoning (`None`: all content).
    pub reasoning: Option<bool>,
    /// The reply is gpt-oss harmony messages ([`super::harmony`]): its `analysis` channel is
    /// reasoning, `final` the content, commentary to `functions.NAME` tool calls (needs the
    /// harmony markers in [`CompletionRequest::markers`]).
    pub harmony: bool,
}

impl CompletionRequest {
    /// Fills [`CompletionRequest::markers`] from `tokenizer` for what the request reads: its
    /// tool format's tags, the `<think>` tags when it splits reasoning, and harmony's markers
    /// for a template that writes harmony (`harmony_template`) or harmony tool calls, which
    /// turns harmony on where the vocabulary holds them (without them the model writes no
    /// harmony, unless a forced call's grammar writes their text).
    pub fn read_markers(&mut self, tokenizer: &Tokenizer, harmony_template: bool) {
        self.markers = self.tool_format.map(|f| f.marker_tokens(tokenizer)).unwrap_or_default();
        if self.reasoning.is_some() {
            self.markers.extend(marker_tokens(THINK_MARKERS, tokenizer));
        }
        let harmony_calls = self.tool_format == Some(ToolFormat::Harmony);
        if harmony_template || harmony_calls {
            let harmony = marker_tokens(HARMONY_MARKERS, tokenizer);
            let forced = harmony_calls && self.options.constraint.is_some();
            self.harmony = harmony.len() == HARMONY_MARKERS.len() || forced;
            for marker in harmony {
                if !self.markers.contains(&marker) {
                    self.markers.push(marker);
                }
            }
        }
    }

    /// Where the prompt leaves the reply inside `<think>` ([`CompletionRequest::reasoning`] is
    /// `Some(true)`: DeepSeek-R1's templates, thinking modes), makes the request's constraint
    /// open by closing the reasoning (`</think>`, as `tokenizer`'s token where it has one), so
    /// that what it shapes (a forced tool call, a JSON answer) is the content, not reasoning.
    pub fn constrain_after_reasoning(&mut self, tokenizer: &Tokenizer) {
        if self.reasoning != Some(true) {
            return;
        }
        if let Some(then) = self.options.constraint.take() {
            let prefix = token_or_text(tokenizer.token_id(THINK_CLOSE), THINK_CLOSE);
            self.options.constraint = Some(Constraint::Prefixed { prefix, then: Box::new(then) });
        }
    }

    /// The options to generate with: [`CompletionRequest::options`] whose constraint may end the
    /// reply where the template's end-of-turn tokens go.
    pub fn generate_options(&self) -> GenerateOptions {
        GenerateOptions { end_tokens: self.stop_tokens.clone(), ..self.options.clone() }
    }
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
    /// The reply ended with tool calls.
    #[serde(rename = "tool_calls")]
    ToolCalls,
}

/// A finished reply.
#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    /// The reply's text, without stop strings, tool calls and reasoning.
    pub text: String,
    /// The reasoning kept apart from it (empty unless asked for).
    pub reasoning: String,
    /// The tool calls parsed out of it.
    pub tool_calls: Vec<ToolCall>,
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
    markers: Vec<(u32, String)>,
    scanner: StopScanner,
    tools: Option<ToolCallScanner>,
    thinking: Option<ReasoningScanner>,
    harmony: Option<HarmonyScanner>,
    text: String,
    reasoning: String,
    finish: Option<FinishReason>,
}

impl Reply {
    /// A reply to `request`.
    pub fn new(request: &CompletionRequest) -> Reply {
        Reply {
            stop_tokens: request.stop_tokens.clone(),
            markers: request.markers.clone(),
            scanner: StopScanner::new(&request.stop_strings),
            tools: request.tool_format.map(ToolCallScanner::new),
            thinking: request.reasoning.map(ReasoningScanner::new),
            harmony: request.harmony.then(HarmonyScanner::default),
            text: String::new(),
            reasoning: String::new(),
            finish: None,
        }
    }

    /// Takes generated token `id` and its text `piece`, calling `on_text` with the content now
    /// certain (it returns `false` to cancel); `false` when the reply has ended.
    pub fn token(&mut self, id: u32, piece: &str, mut on_text: impl FnMut(&str) -> bool) -> bool {
        self.token_parts(id, piece, |part, text| part == Part::Reasoning || on_text(text))
    }

    /// [`Reply::token`] telling reasoning from content: `on_part` gets each certain piece with
    /// its part.
    pub fn token_parts(&mut self, id: u32, piece: &str, mut on_part: impl FnMut(Part, &str) -> bool) -> bool {
        if self.stop_tokens.contains(&id) {
            self.finish = Some(FinishReason::Stop);
            return false;
        }
        let piece = self.markers.iter().find(|(m, _)| *m == id).map_or(piece, |(_, text)| text.as_str());
        let parts = match (&mut self.harmony, &mut self.thinking) {
            (Some(h), _) => h.push(piece),
            (None, Some(t)) => t.push(piece),
            (None, None) => vec![(Part::Content, piece.to_string())],
        };
        parts.into_iter().all(|(part, text)| self.take(part, &text, &mut on_part))
    }

    /// Takes `text` of `part`: reasoning as it is, content past the stop strings and tool calls;
    /// `false` when the reply has ended.
    fn take(&mut self, part: Part, text: &str, on_part: &mut impl FnMut(Part, &str) -> bool) -> bool {
        let safe = match part {
            Part::Reasoning => {
                self.reasoning.push_str(text);
                text.to_string()
            }
            Part::Content => {
                let passed = self.scanner.push(text);
                let safe = self.released(passed);
                self.text.push_str(&safe);
                safe
            }
        };
        if !safe.is_empty() && !on_part(part, &safe) {
            self.finish = Some(FinishReason::Cancelled);
            return false;
        }
        if self.scanner.stopped() {
            self.finish = Some(FinishReason::Stop);
            return false;
        }
        true
    }

    /// `safe` (past the stop strings) less what may be a tool call.
    fn released(&mut self, safe: String) -> String {
        match &mut self.tools {
            Some(t) => t.push(&safe),
            None => safe,
        }
    }

    /// Ends the reply after `generation` of `request` (whose whole prompt is
    /// `generation.prompt_tokens`) in a context of `context` positions, passing any content
    /// held back to `on_text`.
    pub fn finish(
        self,
        generation: Generation,
        request: &CompletionRequest,
        context: usize,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Completion {
        self.finish_parts(generation, request, context, |part, text| part == Part::Reasoning || on_text(text))
    }

    /// [`Reply::finish`] telling reasoning from content.
    pub fn finish_parts(
        mut self,
        generation: Generation,
        request: &CompletionRequest,
        context: usize,
        mut on_part: impl FnMut(Part, &str) -> bool,
    ) -> Completion {
        if let Some((part, text)) = self.thinking.take().and_then(ReasoningScanner::finish) {
            if self.finish.is_none() {
                self.take(part, &text, &mut on_part);
            }
        }
        let mut harmony_calls = Vec::new();
        if let Some(h) = self.harmony.take() {
            let (parts, calls) = h.finish();
            // Held text (a possible marker's start) is the reply's unless it was cancelled; after
            // a stop string the stop scanner drops it.
            if self.finish != Some(FinishReason::Cancelled) {
                for (part, text) in parts {
                    self.take(part, &text, &mut on_part);
                }
            }
            harmony_calls = calls.into_iter().map(|(name, arguments)| ToolCall::new(name, arguments)).collect();
        }
        let mut on_text = |text: &str| on_part(Part::Content, text);
        let mut finish_reason = match self.finish {
            Some(f) => f,
            None => {
                let rest = self.scanner.finish();
                let rest = self.released(rest);
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
        let mut tool_calls = harmony_calls;
        if !tool_calls.is_empty() && finish_reason != FinishReason::Cancelled {
            finish_reason = FinishReason::ToolCalls;
        }
        if let Some(t) = self.tools.take() {
            let (rest, calls) = t.finish();
            self.text.push_str(&rest);
            if !rest.is_empty() {
                on_text(&rest);
            }
            if !calls.is_empty() && finish_reason != FinishReason::Cancelled {
                finish_reason = FinishReason::ToolCalls;
            }
            tool_calls.extend(calls);
        }
        Completion { text: self.text, reasoning: self.reasoning, tool_calls, finish_reason, generation }
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
    let options = request.generate_options();
    let mut generation =
        engine.generate_in(session, &prompt[keep..], &options, |id, piece| reply.token(id, piece, &mut on_text))?;
    generation.prompt_tokens = prompt.to_vec();
    Ok(reply.finish(generation, request, engine.context(), on_text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generation of `tokens` (after a one-token prompt) reading `text`.
    fn generation(tokens: Vec<u32>, text: String) -> Generation {
        Generation {
            prompt_tokens: vec![1],
            tokens,
            text,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            stats: Default::default(),
        }
    }

    #[test]
    fn a_reply_with_a_tool_call_ends_as_one() {
        // Qwen3's format, the text split across tokens as a model writes it; a stop string
        // elsewhere does not disturb it.
        let request = CompletionRequest {
            stop_strings: vec!["STOP".into()],
            tool_format: Some(ToolFormat::Hermes),
            ..Default::default()
        };
        let mut reply = Reply::new(&request);
        let mut shown = String::new();
        let pieces = [
            "I will",
            " look.",
            "\n<tool",
            "_call>\n{\"name\": \"lookup\",",
            " \"arguments\": {\"q\": \"x\"}}\n</tool_call>",
        ];
        for (i, p) in pieces.iter().enumerate() {
            assert!(reply.token(i as u32, p, |t| {
                shown.push_str(t);
                true
            }));
        }
        let generation = generation(vec![0, 1, 2, 3, 4], pieces.concat());
        let c = reply.finish(generation, &request, 100, |t| {
            shown.push_str(t);
            true
        });
        assert_eq!(shown, "I will look.\n");
        assert_eq!(c.text, "I will look.\n");
        assert_eq!(c.finish_reason, FinishReason::ToolCalls);
        assert_eq!(c.tool_calls.len(), 1);
        assert_eq!((c.tool_calls[0].name.as_str(), c.tool_calls[0].arguments.as_str()), ("lookup", "{\"q\":\"x\"}"));
    }

    #[test]
    fn a_marker_token_the_detokenizer_drops_is_read_as_its_text() {
        // Mistral: `[TOOL_CALLS]` is special, so its piece comes empty; the reply reads its text.
        let request = CompletionRequest {
            tool_format: Some(ToolFormat::Mistral),
            markers: vec![(7, "[TOOL_CALLS]".into())],
            ..Default::default()
        };
        let mut reply = Reply::new(&request);
        let mut shown = String::new();
        let pieces = [(3, "Checking."), (7, ""), (4, "[{\"name\": \"now\", "), (5, "\"arguments\": {}}]")];
        for (id, p) in pieces {
            assert!(reply.token(id, p, |t| {
                shown.push_str(t);
                true
            }));
        }
        let generation = generation(pieces.iter().map(|(id, _)| *id).collect(), String::new());
        let c = reply.finish(generation, &request, 100, |t| {
            shown.push_str(t);
            true
        });
        assert_eq!((shown.as_str(), c.finish_reason), ("Checking.", FinishReason::ToolCalls));
        assert_eq!((c.tool_calls[0].name.as_str(), c.tool_calls[0].arguments.as_str()), ("now", "{}"));
    }

    #[test]
    fn a_harmony_reply_splits_into_reasoning_answer_and_calls() {
        // gpt-oss: the markers are special tokens (empty pieces); `<|call|>` ends the turn.
        let markers: Vec<(u32, String)> = ["<|channel|>", "<|message|>", "<|end|>", "<|start|>"]
            .iter()
            .enumerate()
            .map(|(i, m)| (100 + i as u32, m.to_string()))
            .collect();
        let request = CompletionRequest { harmony: true, markers, stop_tokens: vec![200], ..Default::default() };
        let run = |tokens: &[(u32, &str)]| {
            let mut reply = Reply::new(&request);
            let mut parts: Vec<(Part, String)> = Vec::new();
            for &(id, piece) in tokens {
                if !reply.token_parts(id, piece, |p, t| {
                    parts.push((p, t.to_string()));
                    true
                }) {
                    break;
                }
            }
            let generation = generation(tokens.iter().map(|(id, _)| *id).collect(), String::new());
            let c = reply.finish_parts(generation, &request, 1000, |p, t| {
                parts.push((p, t.to_string()));
                true
            });
            (parts, c)
        };
        let (parts, c) = run(&[
            (100, ""),
            (1, "analysis"),
            (101, ""),
            (2, "Greeted."),
            (102, ""),
            (103, ""),
            (3, "assistant"),
            (100, ""),
            (4, "final"),
            (101, ""),
            (5, "Hi"),
            (6, " there"),
        ]);
        assert_eq!(
            (c.reasoning.as_str(), c.text.as_str(), c.finish_reason),
            ("Greeted.", "Hi there", FinishReason::Stop)
        );
        assert_eq!(parts[0], (Part::Reasoning, "Greeted.".to_string()), "reasoning streams as such");
        let (_, c) =
            run(&[(100, ""), (1, "commentary to=functions.now "), (7, "json"), (101, ""), (8, "{}"), (200, "")]);
        assert_eq!((c.text.as_str(), c.finish_reason), ("", FinishReason::ToolCalls));
        assert_eq!((c.tool_calls[0].name.as_str(), c.tool_calls[0].arguments.as_str()), ("now", "{}"));
    }

    #[test]
    fn reasoning_is_kept_apart_from_the_answer() {
        // Qwen3 thinking, then answering with a stop string that reasoning text does not trip.
        let request =
            CompletionRequest { stop_strings: vec!["END".into()], reasoning: Some(false), ..Default::default() };
        let mut reply = Reply::new(&request);
        let mut parts: Vec<(Part, String)> = Vec::new();
        for (i, p) in
            ["<th", "ink>\nI should say E", "ND-less hi.\n</thi", "nk>\n\nHi", " there END ignored"].iter().enumerate()
        {
            reply.token_parts(i as u32, p, |part, t| {
                parts.push((part, t.to_string()));
                true
            });
        }
        let generation = generation(vec![0; 5], String::new());
        let c = reply.finish_parts(generation, &request, 100, |part, t| {
            parts.push((part, t.to_string()));
            true
        });
        assert_eq!(c.reasoning, "\nI should say END-less hi.\n");
        assert_eq!(c.text, "Hi there ");
        assert_eq!(c.finish_reason, FinishReason::Stop);
        let streamed =
            |want: Part| parts.iter().filter(|(p, _)| *p == want).map(|(_, t)| t.as_str()).collect::<String>();
        assert_eq!((streamed(Part::Reasoning), streamed(Part::Content)), (c.reasoning.clone(), c.text.clone()));
    }
}
