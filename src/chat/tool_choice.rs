//! OpenAI's `tool_choice` for a chat reply, and what it makes of the reply's request: calls in
//! the template's format parsed out of the reply (`auto`), left as text (`none`), or forced by
//! constrained decoding (`required`, or a named function). `chat --tools` and the C API's
//! `moestream_chat_message` read it here.

use serde_json::Value;

use super::{CompletionRequest, ToolFormat};
use crate::error::{Error, Result};
use crate::runtime::tokenizer::Tokenizer;

/// Whether and which tool the reply calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides; calls it writes are parsed.
    Auto,
    /// Everything stays text.
    None,
    /// The reply is a call to one of the tools.
    Required,
    /// The reply is a call to this function.
    Named(String),
}

impl ToolChoice {
    /// OpenAI's JSON value: `"auto"` (or absent), `"none"`, `"required"`, or `{"type":
    /// "function", "function": {"name": NAME}}`; anything else is refused by name.
    pub fn from_json(value: Option<&Value>) -> Result<ToolChoice> {
        match value {
            None | Some(Value::Null) => Ok(ToolChoice::Auto),
            Some(Value::String(s)) => ToolChoice::from_flag(s).and_then(|c| match c {
                ToolChoice::Named(_) => Err(Error::InvalidArgument(format!(
                    "tool_choice {s:?}: \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                ))),
                c => Ok(c),
            }),
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                    Ok(ToolChoice::Named(name.to_string()))
                }
                _ => Err(Error::InvalidArgument(format!("tool_choice {v}: a function choice needs a function name"))),
            },
        }
    }

    /// The command line's spelling: `auto`, `none`, `required`, or a function's name.
    pub fn from_flag(s: &str) -> Result<ToolChoice> {
        Ok(match s {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            "" => return Err(Error::InvalidArgument("an empty tool choice".into())),
            name => ToolChoice::Named(name.to_string()),
        })
    }
}

impl CompletionRequest {
    /// Sets up `request`'s tool calls for a reply in the template whose source is
    /// `template_source`, with `tools` (OpenAI tool objects) and `choice`: parsed in the
    /// template's format, or forced by a constraint (which must be the request's only one) whose
    /// markers are `tokenizer`'s tokens where it has them. A template whose calls moestream
    /// cannot parse leaves them text with `auto`, and is an error with a forced choice.
    pub fn use_tools(
        &mut self,
        template_source: &str,
        tools: &[Value],
        choice: &ToolChoice,
        tokenizer: &Tokenizer,
    ) -> Result<()> {
        let format = ToolFormat::of_template(template_source);
        let name = match choice {
            ToolChoice::None => return Ok(()),
            ToolChoice::Auto => {
                if format.is_none() {
                    log::warn!("the chat template writes tool calls in no format moestream parses: they stay text");
                }
                self.tool_format = format;
                return Ok(());
            }
            ToolChoice::Required => None,
            ToolChoice::Named(name) => Some(name.as_str()),
        };
        let Some(format) = format else {
            return Err(Error::InvalidArgument(
                "a forced tool call: the chat template writes tool calls in no format moestream parses".into(),
            ));
        };
        if self.options.constraint.is_some() {
            return Err(Error::InvalidArgument("a forced tool call and another constraint at once".into()));
        }
        self.tool_format = Some(format);
        self.options.constraint = Some(format.forced_call(tools, name, &format.marker_tokens(tokenizer))?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ToolChoice;
    use serde_json::json;

    #[test]
    fn openai_tool_choices_read() {
        assert_eq!(ToolChoice::from_json(None).unwrap(), ToolChoice::Auto);
        assert_eq!(ToolChoice::from_json(Some(&json!("none"))).unwrap(), ToolChoice::None);
        assert_eq!(ToolChoice::from_json(Some(&json!("required"))).unwrap(), ToolChoice::Required);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert_eq!(ToolChoice::from_json(Some(&named)).unwrap(), ToolChoice::Named("get_weather".into()));
        for bad in [json!("sometimes"), json!({"type": "function"}), json!(3), json!({"function": {"name": "f"}})] {
            assert!(ToolChoice::from_json(Some(&bad)).is_err(), "{bad}");
        }
        assert_eq!(ToolChoice::from_flag("get_weather").unwrap(), ToolChoice::Named("get_weather".into()));
    }
}
