//! gpt-oss's harmony replies: messages of the form `<|channel|>CHANNEL[ to=RECIPIENT][
//! <|constrain|>json]<|message|>TEXT` separated by `<|end|><|start|>assistant` (a call's message
//! ends at `<|call|>`, usually an end-of-turn token). The `analysis`
//! channel is reasoning, `final` the answer, `commentary` to a `functions.NAME` recipient a tool
//! call (its text the JSON arguments; the recipient may also come before the channel, in the
//! `<|start|>assistant to=…` header), other commentary the answer's. The markers are special
//! tokens the detokenizer drops: the reply reads their text ([`super::CompletionRequest::markers`]).
//! A reply that never opens a message (no harmony) is content, released at its end.

use super::reasoning::Part;
use super::stop::partial_marker_len;

/// Opens a message's channel name.
pub(super) const CHANNEL: &str = "<|channel|>";
/// Opens a message's text.
pub(super) const MESSAGE: &str = "<|message|>";
/// Ends a message.
const END: &str = "<|end|>";
/// Opens the next message's header.
const START: &str = "<|start|>";
/// Marks a message's text as written in a format (`<|constrain|>json`: a call's arguments).
pub(super) const CONSTRAIN: &str = "<|constrain|>";
/// Ends a tool call's message (an end-of-turn token where the template writes it).
pub(super) const CALL: &str = "<|call|>";
/// What a message's text may end at.
const ENDS: [&str; 4] = [END, START, CHANNEL, CALL];
/// The special tokens of harmony replies (their text must reach the scanner).
pub const HARMONY_MARKERS: &[&str] = &[CHANNEL, MESSAGE, END, START, CONSTRAIN];

/// Text released with the part it belongs to.
pub type Pieces = Vec<(Part, String)>;

/// A call: the function's name and its JSON arguments.
pub type Call = (String, String);

/// Whether a chat template writes harmony messages.
pub fn is_harmony(template_source: &str) -> bool {
    template_source.contains(CHANNEL) && template_source.contains(MESSAGE)
}

/// Splits a harmony reply as it streams (see the module's doc).
#[derive(Default)]
pub struct HarmonyScanner {
    /// Text not yet placed: a header being read, or a message's possible end marker.
    pending: String,
    /// The message being read, once its header is complete.
    message: Option<Message>,
    /// Whether any message was opened.
    opened: bool,
    /// The calls so far.
    calls: Vec<Call>,
}

/// A message whose text is being read.
struct Message {
    /// Reasoning or content (`None`: a tool call's arguments, kept apart).
    part: Option<Part>,
    /// The function a call goes to.
    function: Option<String>,
    /// A call's arguments so far.
    arguments: String,
}

impl HarmonyScanner {
    /// Adds reply text; returns the pieces now known, each with its part.
    pub fn push(&mut self, piece: &str) -> Pieces {
        self.pending.push_str(piece);
        let mut out = Vec::new();
        loop {
            match &mut self.message {
                None => {
                    let Some(at) = self.pending.find(MESSAGE) else { break };
                    let header: String = self.pending.drain(..at + MESSAGE.len()).collect();
                    self.message = Some(Message::from_header(&header[..at]));
                    self.opened = true;
                }
                Some(m) => {
                    let end = ENDS.iter().filter_map(|e| self.pending.find(e)).min();
                    let upto = end.unwrap_or(self.pending.len() - partial_marker_len(&self.pending, ENDS.into_iter()));
                    let text: String = self.pending.drain(..upto).collect();
                    m.take(text, &mut out);
                    if end.is_none() {
                        break;
                    }
                    // The message ended: what follows is the next header.
                    let m = self.message.take().expect("a message was being read");
                    self.end_message(m, &mut out);
                    if let Some(end) = [END, CALL].into_iter().find(|e| self.pending.starts_with(e)) {
                        self.pending.drain(..end.len());
                    }
                }
            }
        }
        out
    }

    /// A message `m` ended: a call's goes to the calls with its arguments as compact JSON (a
    /// model may lay them out over lines); one whose arguments are no JSON object degrades to
    /// content, its text as the model wrote it, as malformed calls of other formats do.
    fn end_message(&mut self, m: Message, out: &mut Pieces) {
        let Some(function) = m.function else { return };
        match serde_json::from_str::<serde_json::Value>(&m.arguments) {
            Ok(v @ serde_json::Value::Object(_)) => self.calls.push((function, v.to_string())),
            _ if m.arguments.is_empty() => {}
            _ => out.push((Part::Content, m.arguments)),
        }
    }

    /// Ends the reply: its last pieces and the tool calls. A reply that opened no message is
    /// all content.
    pub fn finish(mut self) -> (Pieces, Vec<Call>) {
        let mut out = Vec::new();
        match self.message.take() {
            Some(mut m) => {
                m.take(std::mem::take(&mut self.pending), &mut out);
                self.end_message(m, &mut out);
            }
            None if !self.opened && !self.pending.is_empty() => out.push((Part::Content, self.pending)),
            None => {}
        }
        (out, self.calls)
    }
}

impl Message {
    /// The message a header (`<|channel|>final`, `assistant to=functions.f<|channel|>commentary
    /// <|constrain|>json`, …) opens.
    fn from_header(header: &str) -> Message {
        let channel = header
            .rsplit(CHANNEL)
            .next()
            .filter(|_| header.contains(CHANNEL))
            .and_then(|c| c.split_whitespace().next())
            .unwrap_or("final");
        let function = header
            .split_whitespace()
            .find_map(|w| w.strip_prefix("to=functions."))
            .map(|f| f.split("<|").next().unwrap_or(f).to_string())
            .filter(|f| !f.is_empty());
        let part = match (channel, &function) {
            (_, Some(_)) => None,
            ("analysis", None) => Some(Part::Reasoning),
            _ => Some(Part::Content),
        };
        Message { part, function, arguments: String::new() }
    }

    /// Places `text` of this message: released with its part, or kept as a call's arguments.
    fn take(&mut self, text: String, out: &mut Pieces) {
        match self.part {
            _ if text.is_empty() => {}
            Some(part) => out.push((part, text)),
            None => self.arguments.push_str(&text),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `n` characters; the reasoning, the content and the calls.
    fn scan(text: &str, n: usize) -> (String, String, Vec<(String, String)>) {
        let mut s = HarmonyScanner::default();
        let chars: Vec<char> = text.chars().collect();
        let mut parts: Vec<(Part, String)> =
            chars.chunks(n).flat_map(|c| s.push(&c.iter().collect::<String>())).collect();
        let (rest, calls) = s.finish();
        parts.extend(rest);
        let of = |p: Part| parts.iter().filter(|(q, _)| *q == p).map(|(_, t)| t.as_str()).collect::<String>();
        (of(Part::Reasoning), of(Part::Content), calls)
    }

    #[test]
    fn reasoning_answer_and_calls_in_every_split() {
        let answer =
            "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello!";
        let call = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary \
                    to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}";
        let call_in_header = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant \
                              to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}";
        for n in 1..=answer.chars().count() {
            assert_eq!(scan(answer, n), ("The user greets.".into(), "Hello!".into(), vec![]), "split {n}");
        }
        for text in [call, call_in_header] {
            for n in 1..=text.chars().count() {
                let want = (
                    "Need weather.".into(),
                    String::new(),
                    vec![("get_weather".into(), "{\"city\":\"Paris\"}".into())],
                );
                assert_eq!(scan(text, n), want, "split {n}: {text}");
            }
        }
        // A call's message ends at `<|call|>` (when it is no stop token), its JSON compacted.
        let called =
            "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 1,\n \"b\": 2}<|call|>";
        for n in 1..=called.chars().count() {
            let want = (String::new(), String::new(), vec![("add".into(), "{\"a\":1,\"b\":2}".into())]);
            assert_eq!(scan(called, n), want, "split {n}");
        }
        // A call whose arguments are no JSON object is content, not a call.
        let broken = "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{\"a\": 1,<|call|>";
        for n in 1..=broken.chars().count() {
            assert_eq!(scan(broken, n), (String::new(), "{\"a\": 1,".into(), vec![]), "split {n}");
        }
        // Not harmony at all: content, at the end.
        assert_eq!(scan("plain words", 3), (String::new(), "plain words".into(), vec![]));
        // A preamble on the commentary channel without a recipient is content.
        let preamble =
            "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>final<|message|>Done.";
        assert_eq!(scan(preamble, 5), (String::new(), "Checking.Done.".into(), vec![]));
    }

    #[test]
    fn gpt_oss_template_is_harmony() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates/openai-gpt-oss-120b.jinja");
        assert!(is_harmony(&std::fs::read_to_string(path).unwrap()));
        assert!(!is_harmony("{{ '<tool_call>' }}"));
    }
}
