//! Tool calls written between special tokens, which the detokenizer drops from the text: the
//! reply sees them because [`super::Reply`] puts each marker token's own text in its place
//! ([`marker_tokens`]). Mistral's `[TOOL_CALLS]` (a JSON list of `{"name", "arguments"}`, or,
//! from the v11 tokenizer on, `NAME[ARGS]{…}` per call) and DeepSeek-V3's
//! `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`
//! (V3.1's; V3's `function<｜tool▁sep｜>NAME` + a fenced JSON block too).

use serde_json::Value;

use crate::runtime::tokenizer::Tokenizer;

/// Mistral's marker before the calls.
pub const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
/// Mistral v11's marker before a call's arguments.
pub(super) const MISTRAL_ARGS: &str = "[ARGS]";
/// Mistral v11's marker before a call's id.
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
/// The markers of Mistral's calls.
pub const MISTRAL_MARKERS: &[&str] = &[MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID];

/// DeepSeek-V3's marker before the calls.
pub const DEEPSEEK_CALLS: &str = "<｜tool▁calls▁begin｜>";
pub(super) const DEEPSEEK_CALL: &str = "<｜tool▁call▁begin｜>";
pub(super) const DEEPSEEK_SEP: &str = "<｜tool▁sep｜>";
pub(super) const DEEPSEEK_CALL_END: &str = "<｜tool▁call▁end｜>";
pub(super) const DEEPSEEK_CALLS_END: &str = "<｜tool▁calls▁end｜>";
/// The markers of DeepSeek-V3's calls.
pub const DEEPSEEK_MARKERS: &[&str] =
    &[DEEPSEEK_CALLS, DEEPSEEK_CALL, DEEPSEEK_SEP, DEEPSEEK_CALL_END, DEEPSEEK_CALLS_END];

/// The ids of `markers` in `tokenizer`'s vocabulary, with their text.
pub fn marker_tokens(markers: &[&str], tokenizer: &Tokenizer) -> Vec<(u32, String)> {
    markers.iter().filter_map(|m| tokenizer.token_id(m).map(|id| (id, m.to_string()))).collect()
}

/// `(name, arguments)` of the calls in `text` (from [`MISTRAL_CALLS`] on); `None` when they do
/// not parse.
pub fn parse_mistral(text: &str) -> Option<Vec<(String, String)>> {
    let body = text.strip_prefix(MISTRAL_CALLS)?.trim_start();
    if body.starts_with('[') {
        // `[{"name": …, "arguments": {…}}, …]`.
        let calls: Vec<Value> = serde_json::from_str(body.trim_end()).ok()?;
        return calls.iter().map(|c| named_arguments(c.get("name")?, c.get("arguments"))).collect();
    }
    // `NAME[CALL_ID]ID[ARGS]{…}`, one per `[TOOL_CALLS]`.
    body.split(MISTRAL_CALLS)
        .map(|call| {
            let (head, arguments) = call.split_once(MISTRAL_ARGS)?;
            let name = head.split(MISTRAL_CALL_ID).next()?.trim();
            let arguments: Value = serde_json::from_str(arguments.trim()).ok()?;
            named_arguments(&Value::from(name), Some(&arguments))
        })
        .collect()
}

/// `(name, arguments)` of the calls in `text` (from [`DEEPSEEK_CALLS`] on); `None` when they do
/// not parse.
pub fn parse_deepseek(text: &str) -> Option<Vec<(String, String)>> {
    let body = text.strip_prefix(DEEPSEEK_CALLS)?;
    let body = body.split(DEEPSEEK_CALLS_END).next()?;
    body.split(DEEPSEEK_CALL)
        .filter(|c| !c.trim().is_empty())
        .map(|call| {
            let call = call.split(DEEPSEEK_CALL_END).next()?;
            let (head, rest) = call.split_once(DEEPSEEK_SEP)?;
            let (name, json) = match head.trim() {
                // V3: `function<｜tool▁sep｜>NAME\n```json\n{…}\n```.
                "function" => {
                    let (name, block) = rest.split_once('\n')?;
                    let json = block.trim().strip_prefix("```json")?.strip_suffix("```")?;
                    (name.trim(), json)
                }
                name => (name, rest),
            };
            let arguments: Value = serde_json::from_str(json.trim()).ok()?;
            named_arguments(&Value::from(name), Some(&arguments))
        })
        .collect()
}

/// A call's name (a non-empty string) and its arguments (an object, or a string holding one;
/// none: `{}`) as JSON text.
fn named_arguments(name: &Value, arguments: Option<&Value>) -> Option<(String, String)> {
    let name = name.as_str().filter(|n| !n.is_empty() && !n.contains(char::is_whitespace))?;
    let arguments = match arguments {
        None => "{}".to_string(),
        Some(Value::String(s)) => serde_json::from_str::<serde_json::Map<String, Value>>(s).ok().map(|_| s.clone())?,
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some((name.to_string(), arguments))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mistral_calls_in_both_layouts() {
        let list = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "now", "arguments": {}}]"#;
        assert_eq!(
            parse_mistral(list).unwrap(),
            vec![("get_weather".into(), r#"{"city":"Paris"}"#.into()), ("now".into(), "{}".into())]
        );
        let v11 = r#"[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[CALL_ID]a1b2c3d4e[ARGS]{}"#;
        assert_eq!(
            parse_mistral(v11).unwrap(),
            vec![("get_weather".into(), r#"{"city":"Paris"}"#.into()), ("now".into(), "{}".into())]
        );
        for bad in ["[TOOL_CALLS][{\"name\": 3}]", "[TOOL_CALLS]get_weather{}", "[TOOL_CALLS][{\"name\": \"f\"", "text"]
        {
            assert_eq!(parse_mistral(bad), None, "{bad}");
        }
    }

    #[test]
    fn deepseek_calls_of_v3_1_and_v3() {
        let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>\
                   <｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(
            parse_deepseek(v31).unwrap(),
            vec![("get_weather".into(), r#"{"city":"Paris"}"#.into()), ("now".into(), "{}".into())]
        );
        let v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```\
                  <｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(parse_deepseek(v3).unwrap(), vec![("get_weather".into(), r#"{"city":"Paris"}"#.into())]);
        // Cut off inside its last call: what is there parses, a broken call does not.
        let cut = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}";
        assert_eq!(parse_deepseek(cut).unwrap(), vec![("now".into(), "{}".into())]);
        assert_eq!(parse_deepseek("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{oops"), None);
    }
}
