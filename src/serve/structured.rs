//! A request's structured-output fields, read into one constraint on the reply: OpenAI's
//! `response_format`, llama-server's `json_schema`, vLLM's `guided_json`, `guided_regex`,
//! `guided_grammar` (Lark) and `guided_choice`. llama-server's `grammar` (GBNF) is refused by
//! name: llguidance reads Lark, not GBNF.

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::runtime::Constraint;

/// The structured-output fields (parsed from the same body as the endpoint's own).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Structured {
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "json_schema":
    /// {"name": ..., "schema": {...}, "strict": ...}}`.
    pub response_format: Option<Value>,
    /// A JSON schema (llama-server's field).
    pub json_schema: Option<Value>,
    /// A JSON schema (vLLM's field).
    pub guided_json: Option<Value>,
    /// A regular expression the whole reply matches (vLLM's field).
    pub guided_regex: Option<String>,
    /// A Lark grammar (vLLM's field; llguidance's dialect).
    pub guided_grammar: Option<String>,
    /// The reply is one of these strings (vLLM's field).
    pub guided_choice: Option<Vec<String>>,
    /// llama-server's GBNF grammar: refused.
    pub grammar: Option<Value>,
}

impl Structured {
    /// The constraint the fields ask for (`None`: free text); more than one, or a malformed
    /// one, is a 400 naming the field.
    pub fn constraint(&self) -> Result<Option<Constraint>, ApiError> {
        if self.grammar.as_ref().is_some_and(|g| !g.is_null()) {
            return Err(ApiError::invalid(
                "`grammar` (GBNF) is not supported by moestream: give a Lark grammar as `guided_grammar`, a regex as \
                 `guided_regex`, or a JSON schema as `json_schema`"
                    .to_string(),
                Some("grammar"),
                "unsupported_parameter",
            ));
        }
        let mut found: Vec<(&str, Constraint)> = Vec::new();
        if let Some(f) = self.response_format.as_ref().filter(|f| !f.is_null()) {
            if let Some(c) = response_format(f)? {
                found.push(("response_format", c));
            }
        }
        for (field, schema) in [("json_schema", &self.json_schema), ("guided_json", &self.guided_json)] {
            if let Some(schema) = schema.as_ref().filter(|s| !s.is_null()) {
                found.push((field, Constraint::JsonSchema(schema_object(field, schema)?)));
            }
        }
        if let Some(rx) = &self.guided_regex {
            found.push(("guided_regex", Constraint::Regex(rx.clone())));
        }
        if let Some(lark) = &self.guided_grammar {
            found.push(("guided_grammar", Constraint::Lark(lark.clone())));
        }
        if let Some(choices) = &self.guided_choice {
            if choices.is_empty() {
                return Err(invalid("guided_choice", "`guided_choice` must list at least one string"));
            }
            let alternatives: Vec<String> = choices.iter().map(|c| Value::from(c.as_str()).to_string()).collect();
            found.push(("guided_choice", Constraint::Lark(format!("start: {}", alternatives.join(" | ")))));
        }
        match found.len() {
            0 | 1 => Ok(found.pop().map(|(_, c)| c)),
            _ => {
                let names: Vec<&str> = found.iter().map(|(f, _)| *f).collect();
                Err(invalid(names[1], &format!("give one of {} at a time", names.join(", "))))
            }
        }
    }
}

/// OpenAI's `response_format`.
fn response_format(f: &Value) -> Result<Option<Constraint>, ApiError> {
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let schema = f.pointer("/json_schema/schema").ok_or_else(|| {
                invalid("response_format", "`response_format.json_schema.schema` must hold the JSON schema")
            })?;
            Ok(Some(Constraint::JsonSchema(schema_object("response_format", schema)?)))
        }
        _ => Err(invalid(
            "response_format",
            "`response_format.type` must be \"text\", \"json_object\" or \"json_schema\"",
        )),
    }
}

/// A schema must be a JSON object (or `true`, any JSON).
fn schema_object(field: &str, schema: &Value) -> Result<Value, ApiError> {
    match schema {
        Value::Object(_) => Ok(schema.clone()),
        Value::Bool(true) => Ok(serde_json::json!({})),
        _ => Err(invalid(field, &format!("`{field}` must be a JSON schema (an object)"))),
    }
}

fn invalid(field: &str, message: &str) -> ApiError {
    ApiError::invalid(message.to_string(), Some(field), "invalid_value")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Result<Option<Constraint>, ApiError> {
        serde_json::from_value::<Structured>(body).unwrap().constraint()
    }

    #[test]
    fn each_field_gives_its_constraint() {
        assert_eq!(read(json!({})).unwrap(), None);
        assert_eq!(read(json!({"response_format": {"type": "text"}})).unwrap(), None);
        assert_eq!(read(json!({"response_format": {"type": "json_object"}})).unwrap(), Some(Constraint::JsonObject));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let rf = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}});
        assert_eq!(read(rf).unwrap(), Some(Constraint::JsonSchema(schema.clone())));
        assert_eq!(read(json!({"json_schema": schema})).unwrap(), Some(Constraint::JsonSchema(schema.clone())));
        assert_eq!(read(json!({"guided_regex": "[a-z]+"})).unwrap(), Some(Constraint::Regex("[a-z]+".into())));
        let choice = read(json!({"guided_choice": ["yes", "no \"way\""]})).unwrap();
        assert_eq!(choice, Some(Constraint::Lark(r#"start: "yes" | "no \"way\"""#.into())));
    }

    #[test]
    fn bad_or_several_fields_are_refused_by_name() {
        for (body, field) in [
            (json!({"grammar": "root ::= \"a\""}), "grammar"),
            (json!({"response_format": {"type": "xml"}}), "response_format"),
            (json!({"response_format": {"type": "json_schema"}}), "response_format"),
            (json!({"json_schema": 3}), "json_schema"),
            (json!({"guided_choice": []}), "guided_choice"),
            (json!({"guided_regex": "a", "json_schema": {}}), "guided_regex"),
        ] {
            let e = read(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {e:?}");
        }
    }
}
