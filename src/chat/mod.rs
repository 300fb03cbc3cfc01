//! Conversations with instruct models: the model's Jinja chat template (rendered the way
//! transformers' `apply_chat_template` does), messages, end-of-turn tokens and stop strings, tool
//! calls parsed out of replies, and [`Reply`], what `chat`, `serve` and the C ABI run a reply
//! through ([`complete`] on one session).

mod completion;
mod forced_calls;
mod harmony;
mod hf_jinja;
mod message;
mod reasoning;
mod stop;
mod template;
mod tool_calls;
mod tool_choice;
mod tool_markers;

pub use completion::{complete, Completion, CompletionRequest, FinishReason, Reply};
pub use harmony::{is_harmony, HarmonyScanner};
pub use message::{ChatMessage, Role};
pub use reasoning::{thinking_start, Part, ReasoningScanner};
pub use stop::{end_of_turn_tokens, StopScanner};
pub use template::{ChatTemplate, RenderOptions, TEMPLATE_FILE};
pub use tool_calls::{ToolCall, ToolCallScanner, ToolFormat};
pub use tool_choice::ToolChoice;
