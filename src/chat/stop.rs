//! Where a reply ends: end-of-turn tokens and caller-given stop strings.

use serde_json::Value;

use super::template::ChatTemplate;
use crate::runtime::Engine;

/// End-of-turn markers of well-known template families (ChatML, Llama 3, Gemma, gpt-oss's final
/// answer and tool call); one counts only when the template writes it and the vocabulary has it.
const KNOWN_END_OF_TURN: &[&str] =
    &["<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|return|>", "<|call|>"];

/// The tokens that end an assistant turn: the model's end-of-sequence ids (`config.json`), the
/// `eos_token_id`s of `generation_config.json` (what transformers' `generate` stops at), the
/// template's `eos_token`, and the known end-of-turn markers the template writes.
pub fn end_of_turn_tokens(engine: &Engine, template: Option<&ChatTemplate>) -> Vec<u32> {
    let mut ids = engine.spec().eos_token_ids.clone();
    let generation_config = std::fs::read_to_string(engine.model_dir().join("generation_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok());
    match generation_config.as_ref().and_then(|c| c.get("eos_token_id")) {
        Some(Value::Number(n)) => ids.extend(n.as_u64().map(|v| v as u32)),
        Some(Value::Array(a)) => ids.extend(a.iter().filter_map(Value::as_u64).map(|v| v as u32)),
        _ => {}
    }
    if let (Some(t), Some(tokenizer)) = (template, engine.tokenizer()) {
        ids.extend(t.eos_token().and_then(|s| tokenizer.token_id(s)));
        ids.extend(KNOWN_END_OF_TURN.iter().filter(|m| t.source().contains(**m)).filter_map(|m| tokenizer.token_id(m)));
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Streams text while watching for stop strings: text that could be the start of a stop string
/// is held back until it is known not to be; nothing from a stop string on is ever released.
pub struct StopScanner {
    stops: Vec<String>,
    pending: String,
    stopped: bool,
}

impl StopScanner {
    /// A scanner for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> StopScanner {
        StopScanner {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// Adds generated text; returns the text now safe to show. After a stop string was seen,
    /// [`StopScanner::stopped`] is true and further text is dropped.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.pending.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.pending.find(s.as_str())).min() {
            self.stopped = true;
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return out;
        }
        let hold = partial_marker_len(&self.pending, self.stops.iter().map(String::as_str));
        let out = self.pending[..self.pending.len() - hold].to_string();
        self.pending.drain(..self.pending.len() - hold);
        out
    }

    /// Whether a stop string ended the text.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The held-back text, released at the end of a generation that did not stop.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Bytes at the end of `text` that could begin one of `markers`: its longest tail that is a
/// proper prefix of one, held back until the next piece tells.
pub(super) fn partial_marker_len<'m>(text: &str, markers: impl Iterator<Item = &'m str> + Clone) -> usize {
    (1..=text.len())
        .rev()
        .filter(|&n| text.is_char_boundary(text.len() - n))
        .find(|&n| {
            let tail = &text[text.len() - n..];
            markers.clone().any(|m| m.len() > n && m.starts_with(tail))
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopScanner::new(&stops);
        let out: Vec<String> = pieces.iter().map(|p| s.push(p)).collect();
        (out, s.stopped(), s.finish())
    }

    #[test]
    fn stop_string_split_across_pieces_is_never_shown() {
        let (out, stopped, rest) = run(&["\nUser:"], &["Hi", " there\n", "Us", "er: more"]);
        assert_eq!(out, ["Hi", " there", "", ""]);
        assert!(stopped);
        assert_eq!(rest, "");
    }

    #[test]
    fn held_text_that_is_not_a_stop_is_released() {
        let (out, stopped, rest) = run(&["END"], &["aE", "Nx", "yE"]);
        assert_eq!(out, ["a", "ENx", "y"]);
        assert!(!stopped);
        assert_eq!(rest, "E");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (out, stopped, _) = run(&["c", "ab"], &["xabc"]);
        assert_eq!(out, ["x"]);
        assert!(stopped);
    }
}
