//! The OpenAI request bodies moestream accepts, and their checks. Fields it does not know (and
//! `model`: the server runs one) are ignored, as OpenAI-compatible servers do; fields it knows but cannot honour (
//! `logit_bias`, structured output, `echo` with `stream`, `suffix`, `best_of`) are
//! refused by name rather than silently ignored.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::ApiError;
use crate::chat::ChatMessage;
use crate::runtime::{SamplingOverrides, SamplingParams};

/// `stop`: one string or a list of up to four.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// Most stop strings a request may give: OpenAI takes 4, but evaluation harnesses add the
/// end-of-text string to a task's own (vLLM and llama-server take any number).
pub const MAX_STOP_STRINGS: usize = 16;

/// `prompt` of `/v1/completions`: text, token ids, or a one-element list of either.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A batch of texts (only one is supported).
    Texts(Vec<String>),
    /// A batch of token-id lists (only one is supported), as lm-evaluation-harness sends.
    TokenLists(Vec<Vec<u32>>),
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the `usage` counts.
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields `/v1/completions` and `/v1/chat/completions` share, parsed from the same body as
/// the endpoint's own fields (not flattened into them, so that errors keep the field's name).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Sampling {
    /// Most tokens to generate.
    pub max_tokens: Option<u32>,
    /// The newer name of `max_tokens`.
    pub max_completion_tokens: Option<u32>,
    /// 0..=2; 0 is greedy. Absent, this and every sampling field below take the model's
    /// default ([`crate::runtime::Engine::sampling_defaults`]), as vLLM and llama-server do.
    pub temperature: Option<f32>,
    /// Nucleus threshold, (0, 1].
    pub top_p: Option<f32>,
    /// Seed for sampling, any integer (default, or -1 as in llama.cpp: a fresh one per request).
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Keep generating past end-of-sequence tokens (the vLLM / llama-server extension).
    #[serde(default)]
    pub ignore_eos: bool,
    /// Choices of the reply (at most the server's parallel requests).
    pub n: Option<u32>,
    /// Subtracted from the logits of tokens the sequence holds, in [-2, 2] (OpenAI's).
    pub presence_penalty: Option<f32>,
    /// Subtracted per occurrence, in [-2, 2] (OpenAI's).
    pub frequency_penalty: Option<f32>,
    /// llama.cpp's repetition penalty (> 0; 1 is off), over `repeat_last_n` tokens.
    pub repeat_penalty: Option<f32>,
    /// Tokens the penalties look back over (64 unless the model says otherwise).
    pub repeat_last_n: Option<u32>,
    /// Drop tokens below this fraction of the most likely one's probability, in [0, 1).
    pub min_p: Option<f32>,
    /// Keep the k most likely tokens (0 = all; the llama-server / vLLM extension).
    pub top_k: Option<u32>,
    /// Must be empty.
    pub logit_bias: Option<Map<String, Value>>,
    /// Chat: `true` for each generated token's log-probability; completions: the number of
    /// most likely alternatives to report with it (0..=20).
    pub logprobs: Option<Value>,
    /// Chat: alternatives to report with each token's log-probability (0..=20; needs
    /// `logprobs: true`).
    pub top_logprobs: Option<u32>,
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Tool schemas, given to the template.
    pub tools: Option<Vec<Value>>,
    /// `"auto"` (the default: calls the model writes in its template's format come back as
    /// `tool_calls`), `"none"` (all text), `"required"` (a call to one of the tools, forced by
    /// constrained decoding) or `{"type": "function", "function": {"name": ...}}` (that one).
    pub tool_choice: Option<Value>,
    /// Extra template variables (`enable_thinking`, ...), as vLLM and llama-server accept.
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: PromptInput,
    /// Must be false / absent.
    #[serde(default)]
    pub echo: bool,
    /// Must be absent.
    pub suffix: Option<String>,
    /// Must be 1 / absent.
    pub best_of: Option<u32>,
}

/// Parses a body: malformed JSON and fields of the wrong type are 400s naming the field.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::invalid(format!("request body is not valid JSON: {inner}"), None, "invalid_json");
        }
        let param = (path != ".").then_some(path.as_str());
        let at = param.map(|p| format!("{p}: ")).unwrap_or_default();
        ApiError::invalid(format!("{at}{inner}"), param, "invalid_type")
    })?;
    de.end().map_err(|e| ApiError::invalid(format!("request body is not valid JSON: {e}"), None, "invalid_json"))?;
    Ok(value)
}

fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid(format!("`{param}` {what} is not supported by moestream"), Some(param), "unsupported_parameter")
}

fn out_of_range(param: &str, what: &str) -> ApiError {
    ApiError::invalid(format!("`{param}` must be {what}"), Some(param), "invalid_value")
}

impl Sampling {
    /// The alternatives per token asked for with log-probabilities (`None`: none asked for):
    /// chat's `logprobs: true` with `top_logprobs`, or the completions API's integer `logprobs`.
    pub fn logprobs(&self, chat: bool) -> Result<Option<usize>, ApiError> {
        let max = crate::runtime::logprobs::MAX_TOP_LOGPROBS as u64;
        let asked = match (&self.logprobs, chat) {
            (None | Some(Value::Null) | Some(Value::Bool(false)), _) => None,
            (Some(Value::Bool(true)), true) => Some(self.top_logprobs.unwrap_or(0) as u64),
            (Some(Value::Number(n)), false) => {
                Some(n.as_u64().ok_or_else(|| out_of_range("logprobs", "an integer in 0..=20"))?)
            }
            (Some(_), true) => return Err(out_of_range("logprobs", "a boolean")),
            (Some(_), false) => return Err(out_of_range("logprobs", "an integer in 0..=20")),
        };
        if self.top_logprobs.is_some() && !(chat && asked.is_some()) {
            return Err(out_of_range("top_logprobs", "given only with `logprobs: true` (chat)"));
        }
        match asked {
            Some(n) if n > max => Err(out_of_range(if chat { "top_logprobs" } else { "logprobs" }, "at most 20")),
            other => Ok(other.map(|n| n as usize)),
        }
    }

    /// Checks the fields; returns the token limit asked for (if any), the sampling (the fields
    /// given over `defaults`, the model's) and stop strings.
    /// A limit of 0 tokens is taken only where the prompt is `echo`ed (scored, not continued).
    pub fn check(
        &self,
        defaults: &SamplingParams,
        seed_if_unset: u64,
        echo: bool,
    ) -> Result<(Option<usize>, SamplingParams, Vec<String>), ApiError> {
        if self.n == Some(0) {
            return Err(out_of_range("n", "at least 1"));
        }
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(unsupported("logit_bias", "(non-empty)"));
        }
        if self.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
            return Err(out_of_range("temperature", "between 0 and 2"));
        }
        if self.top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return Err(out_of_range("top_p", "in (0, 1]"));
        }
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        if max_tokens == Some(0) && !echo {
            return Err(out_of_range(
                if self.max_completion_tokens.is_some() { "max_completion_tokens" } else { "max_tokens" },
                "at least 1",
            ));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) if v.len() <= MAX_STOP_STRINGS => v.clone(),
            Some(Stop::Many(_)) => return Err(out_of_range("stop", &format!("at most {MAX_STOP_STRINGS} strings"))),
        };
        let overrides = SamplingOverrides {
            temperature: self.temperature,
            top_k: self.top_k.map(|k| k as usize),
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n.map(|n| n as usize),
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: Some(self.seed_or(seed_if_unset)),
        };
        let sampling = overrides.over(*defaults);
        // The library's own checks (min-p, penalties), as every API gets them.
        sampling.validate().map_err(|e| ApiError::invalid(e.to_string(), None, "invalid_value"))?;
        Ok((max_tokens.map(|m| m as usize), sampling, stop))
    }

    /// The sampling seed: the request's (a negative one by its two's-complement bits), or
    /// `seed_if_unset` when it gives none or -1.
    fn seed_or(&self, seed_if_unset: u64) -> u64 {
        match self.seed {
            None | Some(-1) => seed_if_unset,
            Some(s) => s as u64,
        }
    }

    /// Whether the usage chunk is asked for when streaming.
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage)
    }
}

impl ChatRequest {
    /// Whether tool calls in the reply are parsed: tools were given and `tool_choice` is not
    /// `"none"`.
    pub fn parses_tool_calls(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| !t.is_empty())
            && self.tool_choice.as_ref().and_then(Value::as_str) != Some("none")
    }

    /// The checks particular to chat.
    pub fn check(&self) -> Result<(), ApiError> {
        if self.messages.is_empty() {
            return Err(out_of_range("messages", "a non-empty list"));
        }
        self.forced_call().map(drop)
    }

    /// The call `tool_choice` forces: `None` for `"auto"`, `"none"` or none given, `Some(None)`
    /// for `"required"` (any of the tools), `Some(Some(name))` for a named function.
    pub fn forced_call(&self) -> Result<Option<Option<String>>, ApiError> {
        let forced = match &self.tool_choice {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::String(s)) if s == "auto" || s == "none" => return Ok(None),
            Some(Value::String(s)) if s == "required" => None,
            Some(choice) => match choice.pointer("/function/name").and_then(Value::as_str) {
                Some(name) if choice.get("type").and_then(Value::as_str) == Some("function") => Some(name.to_string()),
                _ => {
                    return Err(out_of_range(
                        "tool_choice",
                        "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            },
        };
        let tools = self.tools.as_deref().unwrap_or_default();
        if tools.is_empty() {
            return Err(out_of_range("tool_choice", "\"auto\" or \"none\" without `tools`"));
        }
        Ok(Some(forced))
    }
}

impl CompletionRequest {
    /// The checks particular to completions.
    pub fn check(&self, stream: bool) -> Result<(), ApiError> {
        if self.echo && stream {
            return Err(unsupported("echo", "with `stream`"));
        }
        if self.suffix.is_some() {
            return Err(unsupported("suffix", ""));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(unsupported("best_of", "other than 1"));
        }
        let batch = match &self.prompt {
            PromptInput::Texts(t) => Some(t.len()),
            PromptInput::TokenLists(t) => Some(t.len()),
            _ => None,
        };
        if batch.is_some_and(|n| n != 1) {
            return Err(unsupported("prompt", "as a batch of several prompts"));
        }
        Ok(())
    }
}
