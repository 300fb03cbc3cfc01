//! A thinking model's reasoning kept apart from its answer: text between `<think>` and
//! `</think>` (Qwen3, DeepSeek-R1-style, GLM-4.5 templates) is reasoning, the rest content. A
//! reply may start inside the reasoning when the template's generation prompt already opened
//! it. A tag split across pieces is held back until it is whole.

use super::stop::partial_marker_len;

const OPEN: &str = "<think>";
pub(super) const CLOSE: &str = "</think>";
/// The reasoning tags, which some vocabularies hold as special tokens the detokenizer drops
/// (GLM-4.5's): a reply reads their text ([`super::CompletionRequest::markers`]).
pub const THINK_MARKERS: &[&str] = &[OPEN, CLOSE];

/// Which part of a reply a piece of text belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The model's reasoning (`reasoning_content`).
    Reasoning,
    /// The answer.
    Content,
}

/// Whether a template thinks in `<think>` tags, and whether a prompt it rendered leaves the
/// reply inside them (the generation prompt opened `<think>` and did not close it).
pub fn thinking_start(template_source: &str, rendered_prompt: &str) -> Option<bool> {
    if !template_source.contains(OPEN) {
        return None;
    }
    let open = rendered_prompt.rfind(OPEN);
    Some(open.is_some_and(|o| rendered_prompt.rfind(CLOSE).is_none_or(|c| c < o)))
}

/// Splits a reply's text into reasoning and content as it streams.
pub struct ReasoningScanner {
    part: Part,
    held: String,
    /// Blank text right after the reasoning is dropped: the answer starts at its first
    /// character that is not blank.
    skip_blank: bool,
}

impl ReasoningScanner {
    /// A scanner for a reply that starts inside the reasoning or not.
    pub fn new(inside: bool) -> ReasoningScanner {
        ReasoningScanner {
            part: if inside { Part::Reasoning } else { Part::Content },
            held: String::new(),
            skip_blank: false,
        }
    }

    /// Adds reply text; returns the text now known to be reasoning or content, in order
    /// (the tags themselves dropped).
    pub fn push(&mut self, piece: &str) -> Vec<(Part, String)> {
        self.held.push_str(piece);
        let mut out = Vec::new();
        loop {
            let tag = match self.part {
                Part::Content => OPEN,
                Part::Reasoning => CLOSE,
            };
            match self.held.find(tag) {
                Some(at) => {
                    let before: String = self.held.drain(..at).collect();
                    self.held.drain(..tag.len());
                    self.emit(&mut out, before);
                    self.part = match self.part {
                        Part::Content => Part::Reasoning,
                        Part::Reasoning => Part::Content,
                    };
                    self.skip_blank = self.part == Part::Content;
                }
                None => {
                    let keep = partial_marker_len(&self.held, [tag].into_iter());
                    let safe: String = self.held.drain(..self.held.len() - keep).collect();
                    self.emit(&mut out, safe);
                    return out;
                }
            }
        }
    }

    /// Ends the reply: what was held back, in the part it was in.
    pub fn finish(mut self) -> Option<(Part, String)> {
        let mut out = Vec::new();
        let held = std::mem::take(&mut self.held);
        self.emit(&mut out, held);
        out.pop()
    }

    /// Adds `text` of the current part to `out` (the answer's leading blanks dropped).
    fn emit(&mut self, out: &mut Vec<(Part, String)>, mut text: String) {
        if self.part == Part::Content && self.skip_blank {
            text = text.trim_start().to_string();
            self.skip_blank = text.is_empty();
        }
        if !text.is_empty() {
            out.push((self.part, text));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` fed in pieces of `n` characters: the reasoning and the content.
    fn split(text: &str, inside: bool, n: usize) -> (String, String) {
        let mut s = ReasoningScanner::new(inside);
        let (mut reasoning, mut content) = (String::new(), String::new());
        let chars: Vec<char> = text.chars().collect();
        let mut parts: Vec<(Part, String)> =
            chars.chunks(n).flat_map(|c| s.push(&c.iter().collect::<String>())).collect();
        parts.extend(s.finish());
        for (p, t) in parts {
            match p {
                Part::Reasoning => reasoning += &t,
                Part::Content => content += &t,
            }
        }
        (reasoning, content)
    }

    #[test]
    fn reasoning_splits_in_every_split() {
        let text = "<think>\nThe user greets me; é.\n</think>\n\nHello! <b>hi</b>";
        for n in 1..=text.chars().count() {
            assert_eq!(
                split(text, false, n),
                ("\nThe user greets me; é.\n".into(), "Hello! <b>hi</b>".into()),
                "pieces of {n}"
            );
        }
        // The template opened the reasoning: the reply starts inside it.
        assert_eq!(split("I think.</think>Yes.", true, 3), ("I think.".into(), "Yes.".into()));
        // Never closed: all reasoning; no tags at all: all content.
        assert_eq!(split("<think>hmm", false, 2), ("hmm".into(), String::new()));
        assert_eq!(split("a < b", false, 1), (String::new(), "a < b".into()));
    }

    #[test]
    fn where_a_rendered_prompt_leaves_the_reply() {
        let qwen3 = "{%- if enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}";
        assert_eq!(thinking_start(qwen3, "<|im_start|>assistant\n"), Some(false));
        assert_eq!(thinking_start(qwen3, "<|im_start|>assistant\n<think>\n\n</think>\n\n"), Some(false));
        assert_eq!(thinking_start(qwen3, "<｜Assistant｜><think>\n"), Some(true));
        assert_eq!(thinking_start("no tags", "<think>"), None);
    }
}
