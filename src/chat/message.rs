//! One message of a conversation, in the shape the OpenAI API and Hugging Face templates share.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions for the whole conversation.
    System,
    /// The person.
    User,
    /// The model.
    Assistant,
    /// A tool's result (`tool_call_id` names the call it answers).
    Tool,
}

/// A message: role, text, and any further fields the template may read (`tool_calls`,
/// `tool_call_id`, `name`, `reasoning_content`, ...), passed through untouched.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who wrote it.
    pub role: Role,
    /// Its text. OpenAI's `null` (an assistant turn holding only tool calls) reads as empty, and
    /// a list of content parts as their `text` parts joined.
    #[serde(default, deserialize_with = "text_content")]
    pub content: String,
    /// Other fields, as given.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatMessage {
    /// A message with just a role and text.
    pub fn new(role: Role, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role, content: content.into(), extra: Map::new() }
    }
}

/// A string, `null`, or a list of `{"type": "text", "text": ...}` parts.
fn text_content<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    use serde::de::Error;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
        Null(()),
    }
    #[derive(Deserialize)]
    struct Part {
        #[serde(rename = "type")]
        kind: String,
        text: Option<String>,
    }
    match Content::deserialize(d)
        .map_err(|_| D::Error::custom("content must be a string, null or a list of text parts"))?
    {
        Content::Text(s) => Ok(s),
        Content::Null(()) => Ok(String::new()),
        Content::Parts(parts) => parts
            .into_iter()
            .map(|p| match (p.kind.as_str(), p.text) {
                ("text", Some(t)) => Ok(t),
                (kind, _) => {
                    Err(D::Error::custom(format!("content part of type {kind:?} is not supported (text only)")))
                }
            })
            .collect(),
    }
}
