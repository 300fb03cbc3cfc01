//! Tool calls in a reply, in the format the model's chat template teaches it: text before a
//! call streams as usual, text from a call's opening tag on is held back and parsed when the
//! reply ends into OpenAI-style calls (a name and JSON arguments). A block that does not parse
//! leaves the whole held text as plain content: malformed output degrades to text, never to an
//! error.
//!
//! Formats: Hermes-style `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Qwen2.5, Qwen3,
//! Qwen3.5/3.6, Qwen3-Next templates), GLM-4.5's `<tool_call>NAME<arg_key>K</arg_key>
//! <arg_value>V</arg_value>…</tool_call>` and Llama 3.x's JSON calls (the whole reply one
//! `{"name": …, "parameters": {…}}` object); Mistral's and DeepSeek-V3's calls between special
//! tokens in `tool_markers.rs`. gpt-oss's harmony calls are messages to `functions.NAME`, which
//! [`super::HarmonyScanner`] reads. Every format's call can be forced
//! ([`ToolFormat::forced_call`], `forced_calls.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::Result;
use crate::runtime::Constraint;

use super::forced_calls;
use super::harmony::{is_harmony, CALL, HARMONY_MARKERS};
use super::stop::partial_marker_len;
use super::tool_markers::{
    marker_tokens, parse_deepseek, parse_mistral, DEEPSEEK_CALLS, DEEPSEEK_MARKERS, MISTRAL_ARGS, MISTRAL_CALLS,
    MISTRAL_MARKERS,
};
use crate::runtime::tokenizer::Tokenizer;

/// Opens a Hermes or GLM-4.5 call.
pub(super) const OPEN: &str = "<tool_call>";
/// Closes a Hermes or GLM-4.5 call.
pub(super) const CLOSE: &str = "</tool_call>";
/// GLM-4.5's tags around an argument's key and value.
pub(super) const GLM_MARKERS: [&str; 4] = ["<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"];

/// How a template's calls are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>` + a JSON object with `name` and `arguments` + `</tool_call>`.
    Hermes,
    /// `<tool_call>` + the name, then `<arg_key>`/`<arg_value>` pairs + `</tool_call>`.
    Glm,
    /// The whole reply one JSON object `{"name": …, "parameters": {…}}` (Llama 3.1/3.2/3.3's
    /// JSON tool calling).
    Llama3Json,
    /// Mistral's `[TOOL_CALLS]` special token, then a JSON list of `{"name", "arguments"}`
    /// ([`super::tool_markers`]).
    Mistral,
    /// Mistral's v11 layout, `[TOOL_CALLS]NAME[ARGS]{…}` per call (templates that write
    /// `[ARGS]`); parsed as [`ToolFormat::Mistral`] is.
    MistralV11,
    /// DeepSeek-V3.1's tool-call special tokens, `NAME<｜tool▁sep｜>{…}` per call
    /// ([`super::tool_markers`]).
    DeepSeek,
    /// DeepSeek-V3's (and R1's) layout, `function<｜tool▁sep｜>NAME` + a fenced JSON block per
    /// call (templates that write the fence); parsed as [`ToolFormat::DeepSeek`] is.
    DeepSeekV3,
    /// gpt-oss's harmony: a `commentary` message to `functions.NAME`, read by
    /// [`super::HarmonyScanner`] (the reply's text holds no calls of its own).
    Harmony,
}

/// What Llama 3.x templates tell the model a call looks like.
const LLAMA3_CALL: &str = r#"{"name": function name, "parameters": dictionary of argument name"#;

impl ToolFormat {
    /// The format a chat template's `source` writes tool calls in, if it is one of these.
    pub fn of_template(source: &str) -> Option<ToolFormat> {
        if is_harmony(source) {
            return Some(ToolFormat::Harmony);
        }
        if source.contains(MISTRAL_CALLS) {
            return Some(match source.contains(MISTRAL_ARGS) {
                true => ToolFormat::MistralV11,
                false => ToolFormat::Mistral,
            });
        }
        if source.contains(DEEPSEEK_CALLS) {
            return Some(match source.contains("```json") {
                true => ToolFormat::DeepSeekV3,
                false => ToolFormat::DeepSeek,
            });
        }
        match (source.contains(OPEN), source.contains(GLM_MARKERS[0])) {
            (true, true) => Some(ToolFormat::Glm),
            (true, false) => Some(ToolFormat::Hermes),
            _ if source.contains(LLAMA3_CALL) => Some(ToolFormat::Llama3Json),
            _ => None,
        }
    }

    /// What opens a call (Llama 3's calls open with the reply; harmony's are not in the text).
    fn open(self) -> &'static str {
        match self {
            ToolFormat::Mistral | ToolFormat::MistralV11 => MISTRAL_CALLS,
            ToolFormat::DeepSeek | ToolFormat::DeepSeekV3 => DEEPSEEK_CALLS,
            ToolFormat::Hermes | ToolFormat::Glm | ToolFormat::Llama3Json | ToolFormat::Harmony => OPEN,
        }
    }

    /// The special tokens of this format's calls in `tokenizer`'s vocabulary, with their text:
    /// a reply must see them ([`super::CompletionRequest::markers`]), the detokenizer drops them,
    /// and a forced call's grammar names them by id ([`ToolFormat::forced_call`]).
    pub fn marker_tokens(self, tokenizer: &Tokenizer) -> Vec<(u32, String)> {
        // Tags that are plain tokens read the same either way; GLM-4.5's are special tokens.
        match self {
            ToolFormat::Mistral | ToolFormat::MistralV11 => marker_tokens(MISTRAL_MARKERS, tokenizer),
            ToolFormat::DeepSeek | ToolFormat::DeepSeekV3 => marker_tokens(DEEPSEEK_MARKERS, tokenizer),
            ToolFormat::Hermes => marker_tokens(&[OPEN, CLOSE], tokenizer),
            ToolFormat::Glm => marker_tokens(&[&[OPEN, CLOSE][..], &GLM_MARKERS].concat(), tokenizer),
            ToolFormat::Harmony => marker_tokens(&[HARMONY_MARKERS, &[CALL]].concat(), tokenizer),
            ToolFormat::Llama3Json => Vec::new(),
        }
    }

    /// The constraint that makes a reply one call in this format (`tool_choice` `"required"`,
    /// or a named function): to the tool called `name`, or to any of `tools` (OpenAI tool
    /// objects, whose `parameters` schemas shape the arguments). `markers` are this format's
    /// marker tokens in the model's vocabulary ([`ToolFormat::marker_tokens`]): the grammar
    /// names those by id (a special token is no text a literal could spell) and writes the
    /// others as text.
    pub fn forced_call(self, tools: &[Value], name: Option<&str>, markers: &[(u32, String)]) -> Result<Constraint> {
        forced_calls::forced_call(self, tools, name, markers)
    }
}

/// One parsed call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ToolCall {
    /// Unique within the process (`call_N`).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// Its arguments, a JSON object as text.
    pub arguments: String,
}

impl ToolCall {
    /// A call to `name` with `arguments` (JSON text), given the next id.
    pub fn new(name: String, arguments: String) -> ToolCall {
        ToolCall { id: next_id(), name, arguments }
    }
}

/// Streams a reply's text, holding back what may be a tool call (see the module's doc).
pub struct ToolCallScanner {
    format: ToolFormat,
    /// Text from the first call's opening tag on (or a possible start of it).
    held: String,
    /// Llama 3: the reply did not open with `{`, so it is text.
    text_only: bool,
}

impl ToolCallScanner {
    /// A scanner for calls in `format`.
    pub fn new(format: ToolFormat) -> ToolCallScanner {
        ToolCallScanner { format, held: String::new(), text_only: false }
    }

    /// Adds reply text; returns the text now known not to belong to a call.
    pub fn push(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        if self.format == ToolFormat::Harmony {
            // Harmony's calls are messages of their own, not text in the answer.
            return std::mem::take(&mut self.held);
        }
        if self.format == ToolFormat::Llama3Json {
            // A call is the whole reply: held while it may be one, all text once it cannot.
            let start = self.held.trim_start();
            self.text_only |= !(start.is_empty() || start.starts_with('{'));
            return match self.text_only {
                true => std::mem::take(&mut self.held),
                false => String::new(),
            };
        }
        let open = self.format.open();
        if let Some(at) = self.held.find(open) {
            // From the opening tag on, everything waits for the end.
            return self.held.drain(..at).collect();
        }
        // Keep back only a suffix that could begin the tag.
        let safe = self.held.len() - partial_marker_len(&self.held, [open].into_iter());
        self.held.drain(..safe).collect()
    }

    /// Ends the reply: the held text's calls and the text that remains content (all of it
    /// when a call does not parse).
    pub fn finish(self) -> (String, Vec<ToolCall>) {
        if self.format == ToolFormat::Llama3Json {
            return match parse_hermes(&self.held) {
                Some((name, arguments)) => (String::new(), vec![ToolCall { id: next_id(), name, arguments }]),
                None => (self.held, Vec::new()),
            };
        }
        let marked = match self.format {
            ToolFormat::Mistral | ToolFormat::MistralV11 => Some(parse_mistral(&self.held)),
            ToolFormat::DeepSeek | ToolFormat::DeepSeekV3 => Some(parse_deepseek(&self.held)),
            ToolFormat::Harmony => return (self.held, Vec::new()),
            _ => None,
        };
        if let Some(calls) = marked {
            return match calls {
                Some(calls) if !calls.is_empty() => (
                    String::new(),
                    calls.into_iter().map(|(name, arguments)| ToolCall { id: next_id(), name, arguments }).collect(),
                ),
                _ => (self.held, Vec::new()),
            };
        }
        match parse_calls(self.format, &self.held) {
            Some((rest, calls)) if !calls.is_empty() => (rest, calls),
            _ => (self.held, Vec::new()),
        }
    }
}

/// The calls in `text` (which starts at the first opening tag, or holds none) and the text
/// around them; `None` when a block does not parse.
fn parse_calls(format: ToolFormat, text: &str) -> Option<(String, Vec<ToolCall>)> {
    let mut calls = Vec::new();
    let mut rest = String::new();
    let mut tail = text;
    while let Some(start) = tail.find(OPEN) {
        rest.push_str(&tail[..start]);
        let body_start = start + OPEN.len();
        // A reply cut off inside its last call still has the call's body.
        let (body, after) = match tail[body_start..].find(CLOSE) {
            Some(end) => (&tail[body_start..body_start + end], &tail[body_start + end + CLOSE.len()..]),
            None => (&tail[body_start..], ""),
        };
        let (name, arguments) = match format {
            ToolFormat::Glm => parse_glm(body)?,
            _ => parse_hermes(body)?,
        };
        calls.push(ToolCall { id: next_id(), name, arguments });
        tail = after;
    }
    rest.push_str(tail);
    Some((rest.trim().to_string(), calls))
}

/// `{"name": …, "arguments": {…} or "…"}` (or `"parameters"`, Llama 3's name).
fn parse_hermes(body: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None => "{}".to_string(),
        Some(Value::String(s)) => serde_json::from_str::<Map<String, Value>>(s).ok().map(|_| s.clone())?,
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some((name, arguments))
}

/// `NAME` then `<arg_key>K</arg_key><arg_value>V</arg_value>` pairs; a value that is JSON is
/// taken as such, any other as a string.
fn parse_glm(body: &str) -> Option<(String, String)> {
    let (name, mut pairs) = match body.find("<arg_key>") {
        Some(at) => (&body[..at], &body[at..]),
        None => (body, ""),
    };
    let name = name.trim();
    if name.is_empty() || name.contains('<') {
        return None;
    }
    let mut args = Map::new();
    while !pairs.trim().is_empty() {
        let key = between(pairs.trim_start(), "<arg_key>", "</arg_key>")?;
        pairs = &pairs.trim_start()["<arg_key>".len() + key.len() + "</arg_key>".len()..];
        let value = between(pairs.trim_start(), "<arg_value>", "</arg_value>")?;
        pairs = &pairs.trim_start()["<arg_value>".len() + value.len() + "</arg_value>".len()..];
        let v = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_string()));
        args.insert(key.trim().to_string(), v);
    }
    Some((name.to_string(), Value::Object(args).to_string()))
}

/// The text between `open` (at the start of `s`) and the next `close`.
fn between<'s>(s: &'s str, open: &str, close: &str) -> Option<&'s str> {
    let inner = s.strip_prefix(open)?;
    Some(&inner[..inner.find(close)?])
}

fn next_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("call_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `n` characters; the released text and what `finish` gives.
    fn scan(format: ToolFormat, text: &str, n: usize) -> (String, String, Vec<(String, String)>) {
        let mut s = ToolCallScanner::new(format);
        let chars: Vec<char> = text.chars().collect();
        let released: String = chars.chunks(n).map(|c| s.push(&c.iter().collect::<String>())).collect();
        let (rest, calls) = s.finish();
        (released, rest, calls.into_iter().map(|c| (c.name, c.arguments)).collect())
    }

    #[test]
    fn marker_calls_parse_in_every_split() {
        let mistral = r#"Let me check.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]"#;
        let deepseek = "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>\
                        {\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        for (format, text) in [(ToolFormat::Mistral, mistral), (ToolFormat::DeepSeek, deepseek)] {
            for n in 1..=text.chars().count() {
                let (released, rest, calls) = scan(format, text, n);
                assert_eq!((released.as_str(), rest.as_str()), ("Let me check.", ""), "{format:?} split {n}");
                assert_eq!(calls, vec![("get_weather".into(), r#"{"city":"Paris"}"#.into())], "{format:?} split {n}");
            }
        }
        // A block that does not parse stays text.
        let (released, rest, calls) = scan(ToolFormat::Mistral, "a[TOOL_CALLS]nope", 4);
        assert_eq!((released + &rest, calls.len()), ("a[TOOL_CALLS]nope".to_string(), 0));
    }

    #[test]
    fn llama3_json_calls_parse_in_every_split() {
        // As Llama 3.2's template writes an assistant's call.
        let call = r#"{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}"#;
        for n in 1..=call.len() {
            let (released, rest, calls) = scan(ToolFormat::Llama3Json, call, n);
            assert_eq!((released.as_str(), rest.as_str()), ("", ""), "split {n}");
            assert_eq!(calls, vec![("get_weather".into(), r#"{"city":"Paris","days":2}"#.into())], "split {n}");
        }
        // Text is text, streamed as it comes once it cannot be a call; a brace that is no call
        // comes back whole at the end.
        let text = "It is sunny {mostly}.";
        for n in 1..=text.len() {
            let (released, rest, calls) = scan(ToolFormat::Llama3Json, text, n);
            assert_eq!((format!("{released}{rest}"), calls.len()), (text.to_string(), 0), "split {n}");
            assert_eq!(released, text, "split {n}: released as it came");
        }
        let (released, rest, calls) = scan(ToolFormat::Llama3Json, "{not json", 3);
        assert_eq!((released.as_str(), rest.as_str(), calls.len()), ("", "{not json", 0));
    }

    #[test]
    fn hermes_calls_parse_in_every_split() {
        // As Qwen3's template teaches it.
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        for n in 1..=text.len() {
            let (released, rest, calls) = scan(ToolFormat::Hermes, text, n);
            assert_eq!(released, "Let me check.\n", "split {n}");
            assert_eq!(rest, "");
            assert_eq!(
                calls,
                vec![("get_weather".into(), "{\"city\":\"Paris\",\"days\":2}".into()), ("now".into(), "{}".into())]
            );
        }
    }

    #[test]
    fn harmony_text_passes_through() {
        // Harmony's calls are read from its channels; the text scanner keeps none back.
        let text = "<|channel|>final<|message|>Hi <tool_call>";
        assert_eq!(scan(ToolFormat::Harmony, text, 3), (text.to_string(), String::new(), vec![]));
    }

    #[test]
    fn glm_calls_parse_in_every_split() {
        let text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>";
        for n in 1..=text.len() {
            let (released, rest, calls) = scan(ToolFormat::Glm, text, n);
            assert_eq!((released.as_str(), rest.as_str()), ("", ""), "split {n}");
            assert_eq!(calls, vec![("get_weather".into(), "{\"city\":\"Paris\",\"days\":2}".into())]);
        }
    }

    #[test]
    fn text_without_calls_streams_and_bad_calls_stay_text() {
        let (released, rest, calls) = scan(ToolFormat::Hermes, "a < b and <tool but no call", 3);
        assert_eq!(format!("{released}{rest}"), "a < b and <tool but no call");
        assert!(calls.is_empty());
        let bad = "ok <tool_call>{\"name\": 5}</tool_call>";
        let (released, rest, calls) = scan(ToolFormat::Hermes, bad, 4);
        assert_eq!((released.as_str(), rest.as_str()), ("ok ", "<tool_call>{\"name\": 5}</tool_call>"));
        assert!(calls.is_empty());
        // Cut off before the closing tag: the call still parses.
        let (_, _, calls) = scan(ToolFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}", 5);
        assert_eq!(calls, vec![("f".into(), "{\"x\":1}".into())]);
        assert_eq!(ToolFormat::of_template("…<tool_call>…<arg_key>…"), Some(ToolFormat::Glm));
        assert_eq!(ToolFormat::of_template("{{ '<tool_call>' }}"), Some(ToolFormat::Hermes));
        assert_eq!(ToolFormat::of_template("[TOOL_CALLS]"), Some(ToolFormat::Mistral));
        // The real templates (tests/fixtures/chat_templates).
        let real = |name: &str| {
            let path = format!("{}/tests/fixtures/chat_templates/{name}.jinja", env!("CARGO_MANIFEST_DIR"));
            ToolFormat::of_template(&std::fs::read_to_string(path).unwrap())
        };
        assert_eq!(real("meta-llama-Llama-3.2-3B-Instruct"), Some(ToolFormat::Llama3Json));
        assert_eq!(real("Qwen-Qwen3-0.6B"), Some(ToolFormat::Hermes));
        assert_eq!(real("mistralai-Mistral-Nemo-Instruct-2407"), Some(ToolFormat::Mistral));
        assert_eq!(real("deepseek-ai-DeepSeek-V3.1"), Some(ToolFormat::DeepSeek));
        assert_eq!(real("openai-gpt-oss-120b"), Some(ToolFormat::Harmony));
        assert_eq!(ToolFormat::of_template("{{ '[TOOL_CALLS]' + name + '[ARGS]' }}"), Some(ToolFormat::MistralV11));
        let v3 = "{{ '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + type + '<｜tool▁sep｜>' + name + '\\n```json' }}";
        assert_eq!(ToolFormat::of_template(v3), Some(ToolFormat::DeepSeekV3));
    }
}
