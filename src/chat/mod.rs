//! Conversations with instruct models: the model's Jinja chat template (rendered the way
//! transformers' `apply_chat_template` does), messages, end-of-turn tokens and stop strings, and
//! [`complete`], the one function `chat`, `serve` and the C ABI generate a reply through.

mod completion;
mod hf_jinja;
mod message;
mod stop;
mod template;

pub use completion::{complete, Completion, CompletionRequest, FinishReason, Reply};
pub use message::{ChatMessage, Role};
pub use stop::{end_of_turn_tokens, StopScanner};
pub use template::{ChatTemplate, RenderOptions, TEMPLATE_FILE};
