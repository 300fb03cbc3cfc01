//! Grammars that force a reply to be one tool call in its template's format (`tool_choice`
//! `"required"`, or a named function), for llguidance's Lark dialect. A call's markers that are
//! tokens of the vocabulary are terminals naming their ids (`<[ID]>`): a special token is
//! marked apart in llguidance's token trie, so no text literal can produce it; markers the
//! vocabulary lacks are text. Arguments are `%json` of the function's `parameters` schema, or,
//! in GLM-4.5's key/value layout, string values written raw as its template writes them.

use serde_json::{json, Map, Value};

use super::harmony::{CALL, CHANNEL, CONSTRAIN, MESSAGE};
use super::tool_calls::{ToolFormat, CLOSE, GLM_MARKERS, OPEN};
use super::tool_markers::{
    DEEPSEEK_CALL, DEEPSEEK_CALLS, DEEPSEEK_CALLS_END, DEEPSEEK_CALL_END, DEEPSEEK_SEP, MISTRAL_ARGS, MISTRAL_CALLS,
};
use crate::error::{Error, Result};
use crate::runtime::constraint::bounded_whitespace;
use crate::runtime::Constraint;

/// A function a forced call may go to: its name and its arguments' schema.
struct Function {
    name: String,
    parameters: Value,
}

/// The constraint that makes a reply one call in `format` to the tool called `name`, or to any
/// of `tools` (OpenAI tool objects); `markers` are the format's marker tokens in the model's
/// vocabulary ([`ToolFormat::marker_tokens`]).
pub(super) fn forced_call(
    format: ToolFormat,
    tools: &[Value],
    name: Option<&str>,
    markers: &[(u32, String)],
) -> Result<Constraint> {
    let functions = chosen(tools, name)?;
    let mark = |text: &str| marker(markers, text);
    if let Some(whole) = one_document(format, &functions, &mark) {
        return Ok(whole);
    }
    // The other formats write the name apart: one alternative per function.
    let mut terminals = Vec::new();
    let calls: Vec<String> =
        functions.iter().enumerate().map(|(i, f)| named_call(format, f, i, &mark, &mut terminals)).collect();
    let mut lark =
        format!("start: {}\n", (0..calls.len()).map(|i| format!("call_{i}")).collect::<Vec<_>>().join(" | "));
    for (i, call) in calls.iter().enumerate() {
        lark.push_str(&format!("call_{i}: {call}\n"));
    }
    for terminal in terminals {
        lark.push_str(&terminal);
        lark.push('\n');
    }
    Ok(Constraint::Lark(lark))
}

/// `%json` of `schema` (whitespace bounded as for every schema).
fn json_item(schema: &Value) -> String {
    format!("%json {}", bounded_whitespace(schema.clone()))
}

/// The constraint of the formats whose call is one JSON document with the name inside it
/// (Hermes, Llama 3.x, Mistral's list); `None` for the others.
fn one_document(format: ToolFormat, functions: &[Function], mark: &impl Fn(&str) -> String) -> Option<Constraint> {
    Some(match format {
        ToolFormat::Hermes => {
            let call = json_item(&json!({"anyOf": named_objects(functions, "arguments")}));
            Constraint::Lark(format!("start: {} \"\\n\" {call} \"\\n\" {}\n", mark(OPEN), mark(CLOSE)))
        }
        ToolFormat::Llama3Json => {
            Constraint::JsonSchema(bounded_whitespace(json!({"anyOf": named_objects(functions, "parameters")})))
        }
        ToolFormat::Mistral => {
            let list = json!({"type": "array", "items": {"anyOf": named_objects(functions, "arguments")},
                              "minItems": 1, "maxItems": 1});
            Constraint::Lark(format!("start: {} {}\n", mark(MISTRAL_CALLS), json_item(&list)))
        }
        ToolFormat::MistralV11
        | ToolFormat::DeepSeek
        | ToolFormat::DeepSeekV3
        | ToolFormat::Harmony
        | ToolFormat::Glm => return None,
    })
}

/// The grammar items of a call to `f` (the `call`-th function) in a format that writes the name
/// apart from the arguments; terminals it needs go to `terminals`.
fn named_call(
    format: ToolFormat,
    f: &Function,
    call: usize,
    mark: &impl Fn(&str) -> String,
    terminals: &mut Vec<String>,
) -> String {
    let name = lark_string(&f.name);
    let arguments = json_item(&f.parameters);
    match format {
        ToolFormat::MistralV11 => format!("{} {name} {} {arguments}", mark(MISTRAL_CALLS), mark(MISTRAL_ARGS)),
        ToolFormat::DeepSeek => format!(
            "{} {} {name} {} {arguments} {} {}",
            mark(DEEPSEEK_CALLS),
            mark(DEEPSEEK_CALL),
            mark(DEEPSEEK_SEP),
            mark(DEEPSEEK_CALL_END),
            mark(DEEPSEEK_CALLS_END)
        ),
        ToolFormat::DeepSeekV3 => format!(
            "{} {} \"function\" {} {name} \"\\n```json\\n\" {arguments} \"\\n```\" {} {}",
            mark(DEEPSEEK_CALLS),
            mark(DEEPSEEK_CALL),
            mark(DEEPSEEK_SEP),
            mark(DEEPSEEK_CALL_END),
            mark(DEEPSEEK_CALLS_END)
        ),
        ToolFormat::Harmony => format!(
            "{} {} {} \"json\" {} {arguments} {}",
            mark(CHANNEL),
            lark_string(&format!("commentary to=functions.{} ", f.name)),
            mark(CONSTRAIN),
            mark(MESSAGE),
            mark(CALL)
        ),
        ToolFormat::Glm => {
            let pairs = glm_pairs(&f.parameters, call, mark, terminals);
            format!("{} {name} \"\\n\" {pairs}{}", mark(OPEN), mark(CLOSE))
        }
        ToolFormat::Hermes | ToolFormat::Llama3Json | ToolFormat::Mistral => {
            unreachable!("{format:?} calls are one JSON document (one_document)")
        }
    }
}

/// The functions of `tools` a call may go to: the one called `name`, or all.
fn chosen(tools: &[Value], name: Option<&str>) -> Result<Vec<Function>> {
    let functions: Vec<Function> = tools
        .iter()
        .filter_map(|t| t.get("function"))
        .filter_map(|f| {
            let function = f.get("name").and_then(Value::as_str)?;
            let mut parameters = f.get("parameters").cloned().unwrap_or_else(|| json!({}));
            // Every format's arguments are an object, whatever else the schema leaves open.
            if let Value::Object(p) = &mut parameters {
                p.entry("type").or_insert_with(|| json!("object"));
            }
            Some(Function { name: function.to_string(), parameters })
        })
        .filter(|f| name.is_none_or(|n| f.name == n))
        .collect();
    if functions.is_empty() {
        return Err(Error::InvalidArgument(match name {
            Some(n) => format!("tool_choice names {n:?}, which is not among the tools"),
            None => "tool_choice \"required\" with no function tools".into(),
        }));
    }
    Ok(functions)
}

/// Schemas of `{"name": NAME, key: ARGUMENTS}` objects, one per function.
fn named_objects(functions: &[Function], key: &str) -> Vec<Value> {
    functions
        .iter()
        .map(|f| {
            json!({
                "type": "object",
                "properties": {"name": {"const": f.name}, key: f.parameters},
                "required": ["name", key],
                "additionalProperties": false,
            })
        })
        .collect()
}

/// `text` as a grammar item: the token's id where the vocabulary has it as one of `markers`,
/// else the text.
fn marker(markers: &[(u32, String)], text: &str) -> String {
    token_or_text(markers.iter().find(|(_, t)| t == text).map(|(id, _)| *id), text)
}

/// A grammar item of `text`: the token `id` where the vocabulary has it as one token (a
/// special token, which no text literal produces), else the text.
pub(super) fn token_or_text(id: Option<u32>, text: &str) -> String {
    match id {
        Some(id) => format!("<[{id}]>"),
        None => lark_string(text),
    }
}

/// A Lark string literal of `text` (JSON's string syntax, which the dialect reads; it also
/// wants DEL escaped).
fn lark_string(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes").replace('\u{7f}', "\\u007f")
}

/// GLM-4.5's `<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n` pairs for `parameters`' properties
/// in their order, the required ones always, the others optionally. A value is JSON of its
/// schema, or for a plain string also the raw text GLM-4.5's template writes ([`raw_string`]),
/// whose terminals go to `terminals` (named after call `call`).
fn glm_pairs(parameters: &Value, call: usize, mark: &impl Fn(&str) -> String, terminals: &mut Vec<String>) -> String {
    let [key_open, key_close, value_open, value_close] = GLM_MARKERS;
    let required: Vec<&str> =
        parameters.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    let mut properties: Vec<(&str, Value)> = parameters
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    // A required key the schema does not describe takes any JSON.
    for key in &required {
        if !properties.iter().any(|(k, _)| k == key) {
            properties.push((key, json!({})));
        }
    }
    // Subschemas keep the definitions their `$ref`s point to.
    let definitions: Map<String, Value> =
        ["$defs", "definitions"].iter().filter_map(|d| Some((d.to_string(), parameters.get(*d)?.clone()))).collect();
    let mut pairs = String::new();
    for (i, (key, mut schema)) in properties.into_iter().enumerate() {
        let raw = raw_string(&schema);
        if let Value::Object(o) = &mut schema {
            o.extend(definitions.clone());
        }
        let value = match raw {
            Some(text) => {
                let terminal = format!("GLM_TEXT_{call}_{i}");
                terminals.push(format!("{terminal}: {text}"));
                format!("({terminal} | {})", json_item(&schema))
            }
            None => json_item(&schema),
        };
        let pair = format!(
            "{} {} {} \"\\n\" {} {value} {} \"\\n\"",
            mark(key_open),
            lark_string(key),
            mark(key_close),
            mark(value_open),
            mark(value_close)
        );
        match required.contains(&key) {
            true => pairs.push_str(&format!("{pair} ")),
            false => pairs.push_str(&format!("({pair})? ")),
        }
    }
    pairs
}

/// Text GLM-4.5's parser would read as JSON (it takes a value that parses as JSON as such): a
/// number, `true`, `false` or `null`, or anything opening (after JSON's whitespace) a string, an
/// array or an object; as negated terminals.
const READS_AS_JSON: &str =
    r#"~/\s*(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false|null)\s*/ & ~/\s*["\[{][^<]*/"#;

/// The terminal of a string value written raw, as GLM-4.5's template writes strings, where
/// `schema` is a plain string's (its type, length bounds, an enum, annotations): text without
/// `<` (which would end the value) that does not read as JSON, so that it parses back to the
/// same string; an enum's options that are such text. Strings it leaves out (`"12"`, a
/// pattern's) are written as JSON, quoted, which parses back the same.
fn raw_string(schema: &Value) -> Option<String> {
    const PLAIN: &[&str] = &["type", "description", "title", "examples", "default", "minLength", "maxLength", "enum"];
    let o = schema.as_object()?;
    if o.get("type")?.as_str()? != "string" || o.keys().any(|k| !PLAIN.contains(&k.as_str())) {
        return None;
    }
    let bound = |k: &str| o.get(k).and_then(Value::as_u64);
    // At least a character: an empty value is written as JSON (`""`).
    let (min, max) = (bound("minLength").unwrap_or(0).max(1), bound("maxLength"));
    if max.is_some_and(|max| max < min) {
        return None;
    }
    if let Some(options) = o.get("enum") {
        let raw: Vec<String> = options
            .as_array()?
            .iter()
            .filter_map(Value::as_str)
            .filter(|s| {
                let n = s.chars().count() as u64;
                n >= min
                    && max.is_none_or(|max| n <= max)
                    && !s.contains('<')
                    && serde_json::from_str::<Value>(s).is_err()
            })
            .map(lark_string)
            .collect();
        return (!raw.is_empty()).then(|| raw.join(" | "));
    }
    let max = max.map(|m| m.to_string()).unwrap_or_default();
    Some(format!("/[^<]{{{min},{max}}}/ & {READS_AS_JSON}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer"}},
            "required": ["city"]}}})
    }

    fn lark(format: ToolFormat, markers: &[(u32, String)]) -> String {
        match forced_call(format, &[weather()], None, markers).unwrap() {
            Constraint::Lark(l) => l,
            c => panic!("{c:?}"),
        }
    }

    fn ids(texts: &[&str]) -> Vec<(u32, String)> {
        texts.iter().enumerate().map(|(i, t)| (100 + i as u32, t.to_string())).collect()
    }

    /// The `x-guidance` whitespace every embedded schema gets.
    const WHITESPACE: &str = r#""x-guidance":{"whitespace_pattern":"[\\x20\\x09]|\\x0A[\\x20\\x09]{0,20}"}"#;

    const PARAMS: &str = r#"%json {"type":"object","properties":{"city":{"type":"string","maxLength":20},"days":{"type":"integer"}},"required":["city"],"x-guidance":{"whitespace_pattern":"[\\x20\\x09]|\\x0A[\\x20\\x09]{0,20}"}}"#;

    #[test]
    fn special_token_markers_are_token_ids_and_the_rest_text() {
        let deepseek = ids(&[DEEPSEEK_CALLS, DEEPSEEK_CALL, DEEPSEEK_SEP, DEEPSEEK_CALL_END, DEEPSEEK_CALLS_END]);
        let want = format!("start: call_0\ncall_0: <[100]> <[101]> \"get_weather\" <[102]> {PARAMS} <[103]> <[104]>\n");
        assert_eq!(lark(ToolFormat::DeepSeek, &deepseek), want);
        // Without the tokens, the markers are text.
        let text = lark(ToolFormat::DeepSeek, &[]);
        assert!(
            text.starts_with(
                "start: call_0\ncall_0: \"<｜tool▁calls▁begin｜>\" \"<｜tool▁call▁begin｜>\" \"get_weather\""
            ),
            "{text}"
        );
        let v3 = lark(ToolFormat::DeepSeekV3, &deepseek);
        assert!(v3.contains("<[101]> \"function\" <[102]> \"get_weather\" \"\\n```json\\n\" %json"), "{v3}");
        assert!(v3.ends_with("\"\\n```\" <[103]> <[104]>\n"), "{v3}");
        let mistral = ids(&[MISTRAL_CALLS, MISTRAL_ARGS]);
        assert_eq!(
            lark(ToolFormat::MistralV11, &mistral),
            format!("start: call_0\ncall_0: <[100]> \"get_weather\" <[101]> {PARAMS}\n")
        );
        let list = lark(ToolFormat::Mistral, &mistral);
        assert!(list.starts_with("start: <[100]> %json {\"type\":\"array\",\"items\":{\"anyOf\":[{"), "{list}");
        assert!(list.contains("\"maxItems\":1") && list.contains("\"const\":\"get_weather\""), "{list}");
        let harmony = ids(&[CHANNEL, CONSTRAIN, MESSAGE, CALL]);
        assert_eq!(
            lark(ToolFormat::Harmony, &harmony),
            format!("start: call_0\ncall_0: <[100]> \"commentary to=functions.get_weather \" <[101]> \"json\" <[102]> {PARAMS} <[103]>\n")
        );
        let hermes = lark(ToolFormat::Hermes, &ids(&[OPEN, CLOSE]));
        assert!(
            hermes.starts_with("start: <[100]> \"\\n\" %json {\"anyOf\"") && hermes.ends_with("\"\\n\" <[101]>\n"),
            "{hermes}"
        );
    }

    #[test]
    fn glm_writes_strings_raw_or_as_json_and_other_values_as_json() {
        let glm = lark(ToolFormat::Glm, &ids(&GLM_MARKERS));
        let want = format!(
            concat!(
                "start: call_0\n",
                "call_0: \"<tool_call>\" \"get_weather\" \"\\n\" ",
                "<[100]> \"city\" <[101]> \"\\n\" <[102]> ",
                "(GLM_TEXT_0_0 | %json {{\"type\":\"string\",\"maxLength\":20,{ws}}}) <[103]> \"\\n\" ",
                "(<[100]> \"days\" <[101]> \"\\n\" <[102]> %json {{\"type\":\"integer\",{ws}}} <[103]> \"\\n\")? ",
                "\"</tool_call>\"\n",
                "GLM_TEXT_0_0: /[^<]{{1,20}}/ & {json}\n",
            ),
            ws = WHITESPACE,
            json = READS_AS_JSON
        );
        assert_eq!(glm, want);
        // Raw text: any length bounds; an enum's options that do not read as JSON.
        let raw = |schema: Value| raw_string(&schema);
        assert_eq!(raw(json!({"type": "string", "minLength": 3})).unwrap(), format!("/[^<]{{3,}}/ & {READS_AS_JSON}"));
        assert_eq!(raw(json!({"type": "string", "enum": ["yes", "no"]})).unwrap(), "\"yes\" | \"no\"");
        assert_eq!(raw(json!({"type": "string", "enum": ["yes", "12", "true", "<b>"]})).unwrap(), "\"yes\"");
        // Strings the raw form cannot keep apart from JSON are only written as JSON.
        assert_eq!(raw(json!({"type": "string", "enum": ["12", "null"]})), None);
        assert_eq!(raw(json!({"type": "string", "pattern": "^a"})), None);
        assert_eq!(raw(json!({"type": "string", "maxLength": 0})), None);
        assert_eq!(raw(json!({"type": ["string", "null"]})), None);
    }

    #[test]
    fn raw_text_is_whatever_does_not_read_as_json() {
        use crate::runtime::constraint::Grammars;
        use crate::runtime::tokenizer::Tokenizer;
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen3_moe");
        let tokenizer = Tokenizer::from_dir(std::path::Path::new(dir)).unwrap();
        let grammars = Grammars::new(&tokenizer, 384, 0).unwrap();
        let lark = Constraint::Lark(format!("start: TEXT\nTEXT: /[^<]{{1,40}}/ & {READS_AS_JSON}\n"));
        // Whether the raw terminal takes `text` whole: its tokens accepted, then the end allowed.
        let takes = |text: &str| {
            let mut state = grammars.start(&lark, &[0]).unwrap();
            if tokenizer.encode_raw(text).unwrap().into_iter().any(|id| state.accept(id).is_err()) {
                return false;
            }
            let mut logits = vec![0.0; 384];
            state.mask(&mut logits).is_ok() && logits[0].is_finite()
        };
        for json in ["12", "-3.5e2", "1E+2", " true ", "null", "\"quoted\"", "[1]", "{\"a\": 1}", " 7\n"] {
            assert!(serde_json::from_str::<Value>(json).is_ok() && !takes(json), "{json:?}");
        }
        for text in ["Paris", "2024-01-01", "10 Downing St", "truely", "-x", "0012", "1.", "+1", "nullable"] {
            assert!(serde_json::from_str::<Value>(text).is_err() && takes(text), "{text:?}");
        }
    }

    #[test]
    fn a_named_function_must_be_among_the_tools() {
        let e = forced_call(ToolFormat::Glm, &[weather()], Some("nope"), &[]).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
        assert!(forced_call(ToolFormat::Harmony, &[], None, &[]).is_err());
    }
}
