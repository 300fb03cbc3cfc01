//! Where `chat`'s turns come from: at a terminal, a line editor (reedline: editing, history
//! saved per model, multi-line input); piped, plain lines. Both join lines the same way: a line
//! ending in `\` goes on to the next, and a `"""` opens a block that the next `"""` closes.

use std::io::{BufRead, StdinLock};
use std::path::PathBuf;

use moestream::{Error, Result};

/// Whether the text typed so far (lines joined by newlines) goes on to another line.
pub fn continues(text: &str) -> bool {
    text.ends_with('\\') || text.matches(BLOCK).count() % 2 == 1
}

/// The turn the typed text holds: each line-ending `\` dropped, the `"""` markers dropped, and
/// the blank lines around the whole trimmed.
pub fn turn(text: &str) -> String {
    let joined = text.replace("\\\n", "\n").replace(BLOCK, "");
    joined.trim_matches(['\n', '\r']).to_string()
}

/// The marker of a multi-line block.
const BLOCK: &str = "\"\"\"";

/// A source of turns.
pub enum ChatInput {
    /// A line editor on the terminal.
    #[cfg(feature = "line-editor")]
    Editor(Box<editor::Editor>),
    /// Lines of piped input (or a terminal without the line editor).
    Lines(std::io::Lines<StdinLock<'static>>),
}

impl ChatInput {
    /// The line editor when stdin is a terminal (its history in `history`, when given and
    /// writable), else plain lines.
    pub fn open(history: Option<PathBuf>) -> ChatInput {
        #[cfg(feature = "line-editor")]
        if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            return ChatInput::Editor(Box::new(editor::Editor::new(history)));
        }
        let _ = history;
        ChatInput::Lines(std::io::stdin().lock().lines())
    }

    /// Whether a person types the turns (so prompts and greetings are shown).
    pub fn interactive(&self) -> bool {
        match self {
            #[cfg(feature = "line-editor")]
            ChatInput::Editor(_) => true,
            ChatInput::Lines(_) => false,
        }
    }

    /// The next turn (lines joined as the module says), or `None` at the end of input.
    pub fn next_turn(&mut self) -> Result<Option<String>> {
        match self {
            #[cfg(feature = "line-editor")]
            ChatInput::Editor(e) => e.next_turn(),
            ChatInput::Lines(lines) => {
                let mut text = String::new();
                loop {
                    let Some(line) = lines.next() else {
                        return Ok((!text.is_empty()).then(|| turn(&text)));
                    };
                    let line = line.map_err(|e| Error::io("<stdin>", e))?;
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(line.trim_end_matches(['\r', '\n']));
                    if !continues(&text) {
                        return Ok(Some(turn(&text)));
                    }
                }
            }
        }
    }
}

#[cfg(feature = "line-editor")]
mod editor {
    use std::borrow::Cow;
    use std::path::PathBuf;

    use reedline::{
        FileBackedHistory, Prompt, PromptEditMode, PromptHistorySearch, Reedline, Signal, ValidationResult, Validator,
    };

    use moestream::{Error, Result};

    /// Most lines kept in a model's history file.
    const HISTORY_LINES: usize = 1000;

    /// Reedline with the chat's prompt, history and multi-line rule.
    pub struct Editor {
        line_editor: Reedline,
    }

    impl Editor {
        /// An editor keeping its history in `history` (a warning, and no saved history, when
        /// that file cannot be opened).
        pub fn new(history: Option<PathBuf>) -> Editor {
            let mut line_editor = Reedline::create().with_validator(Box::new(Continuation));
            if let Some(path) = history {
                let opened =
                    path.parent().map_or(Ok(()), std::fs::create_dir_all).map_err(|e| e.to_string()).and_then(|()| {
                        FileBackedHistory::with_file(HISTORY_LINES, path.clone()).map_err(|e| e.to_string())
                    });
                match opened {
                    Ok(h) => line_editor = line_editor.with_history(Box::new(h)),
                    Err(e) => log::warn!("chat history not saved: {}: {e}", path.display()),
                }
            }
            Editor { line_editor }
        }

        /// The next turn; Ctrl-C clears the line being typed, Ctrl-D ends the input.
        pub fn next_turn(&mut self) -> Result<Option<String>> {
            loop {
                match self.line_editor.read_line(&ChatPrompt) {
                    Ok(Signal::Success(text)) => return Ok(Some(super::turn(&text))),
                    Ok(Signal::CtrlD) => return Ok(None),
                    Ok(_) => continue,
                    Err(e) => return Err(Error::io("<terminal>", e)),
                }
            }
        }
    }

    /// Multi-line input: Enter after a trailing `\` or inside a `"""` block adds a line.
    struct Continuation;

    impl Validator for Continuation {
        fn validate(&self, line: &str) -> ValidationResult {
            match super::continues(line) {
                true => ValidationResult::Incomplete,
                false => ValidationResult::Complete,
            }
        }
    }

    /// `> `, and `. ` on continued lines.
    struct ChatPrompt;

    impl Prompt for ChatPrompt {
        fn render_prompt_left(&self) -> Cow<'_, str> {
            Cow::Borrowed("")
        }

        fn render_prompt_right(&self) -> Cow<'_, str> {
            Cow::Borrowed("")
        }

        fn render_prompt_indicator(&self, _mode: PromptEditMode) -> Cow<'_, str> {
            Cow::Borrowed("> ")
        }

        fn render_prompt_multiline_indicator(&self) -> Cow<'_, str> {
            Cow::Borrowed(". ")
        }

        fn render_prompt_history_search_indicator(&self, search: PromptHistorySearch) -> Cow<'_, str> {
            Cow::Owned(format!("(search: {}) ", search.term))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_join_after_a_backslash_and_inside_a_block() {
        assert!(!continues("hello"));
        assert!(continues("first\\"));
        assert_eq!(turn("first\\\nsecond"), "first\nsecond");
        assert!(continues("\"\"\"\nline one"));
        assert!(!continues("\"\"\"\nline one\nline two\n\"\"\""));
        assert_eq!(turn("\"\"\"\nline one\nline two\n\"\"\""), "line one\nline two");
        assert_eq!(turn("\"\"\"one line\"\"\""), "one line");
        // A backslash inside the text is kept.
        assert_eq!(turn("a \\ b"), "a \\ b");
    }
}
