//! `moestream_chat_message`: a reply as an OpenAI assistant message. On the bundled model with
//! Qwen3's real chat template (Hermes-style `<tool_call>` calls): `tool_choice` `"required"`
//! and a named function force a call whose arguments fit the function's parameters (as
//! `tool_calls`, `finish_reason` `"tool_calls"`); a tool's result goes back as a `"tool"`
//! message; without tools the reply is content; bad requests are refused by name. On the
//! gpt-oss fixture with gpt-oss's template, a forced harmony call comes back the same way.

use std::ffi::{CStr, CString};
use std::ptr::null_mut;

use moestream_c::*;
use serde_json::{json, Value};

mod common;
use common::last_error;

/// A model's files with a real family's chat template, in a temporary directory (removed on
/// drop).
struct Templated(std::path::PathBuf);

impl Templated {
    /// The model in `model` (relative to the repository) with the template `template` of
    /// `tests/fixtures/chat_templates`.
    fn new(model: &str, template: &str) -> Templated {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let dir = std::env::temp_dir().join(format!("moestream-chat-message-{template}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"] {
            std::fs::copy(format!("{root}/{model}/{f}"), dir.join(f)).unwrap();
        }
        let template = format!("{root}/tests/fixtures/chat_templates/{template}.jinja");
        std::fs::copy(template, dir.join("chat_template.jinja")).unwrap();
        Templated(dir)
    }
}

impl Drop for Templated {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The reply to `request` (JSON), or the error.
unsafe fn reply(engine: *mut MoestreamEngine, request: &Value, max_tokens: u32) -> Result<Value, String> {
    let mut options = std::mem::MaybeUninit::<MoestreamGenerateOptions>::uninit();
    moestream_generate_options_default(options.as_mut_ptr());
    let mut options = options.assume_init();
    options.max_tokens = max_tokens;
    let request = CString::new(request.to_string()).unwrap();
    let out = moestream_chat_message(engine, null_mut(), request.as_ptr(), &options, None, null_mut(), null_mut());
    if out.is_null() {
        return Err(last_error());
    }
    let text = CStr::from_ptr(out).to_string_lossy().into_owned();
    moestream_string_free(out);
    Ok(serde_json::from_str(&text).unwrap())
}

#[test]
fn tool_calls_come_back_as_openai_messages() {
    let model = Templated::new("models/moestream-tiny-moe", "Qwen-Qwen3-0.6B");
    let engine = common::load(model.0.to_str().unwrap(), Some(2048));
    unsafe {
        let tools = json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
             "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                            "required": ["city"], "additionalProperties": false}}},
            {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
             "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99},
                            "b": {"type": "integer", "minimum": -99, "maximum": 99}},
             "required": ["a", "b"], "additionalProperties": false}}}
        ]);
        let user = json!({"role": "user", "content": "Weather in Paris?"});
        for (choice, names) in [
            (json!("required"), vec!["get_weather", "add"]),
            (json!({"type": "function", "function": {"name": "add"}}), vec!["add"]),
        ] {
            let r = reply(engine, &json!({"messages": [user], "tools": tools, "tool_choice": choice}), 200).unwrap();
            assert_eq!(r["role"], "assistant");
            assert_eq!(r["finish_reason"], "tool_calls", "{r}");
            let call = &r["tool_calls"][0];
            assert_eq!(call["type"], "function");
            assert!(call["id"].as_str().is_some_and(|id| !id.is_empty()), "{r}");
            let name = call["function"]["name"].as_str().unwrap();
            assert!(names.contains(&name), "{choice}: {name}");
            let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            match name {
                "add" => assert!(args["a"].is_i64() && args["b"].is_i64(), "{args}"),
                _ => assert!(args["city"].is_string(), "{args}"),
            }
            // The call and its result go back through the template; the next reply is text.
            let assistant = json!({"role": "assistant", "content": "", "tool_calls": [call]});
            let result = json!({"role": "tool", "tool_call_id": call["id"], "content": "{\"result\": 4}"});
            let next = json!({"messages": [user, assistant, result], "tools": tools, "tool_choice": "none"});
            let r = reply(engine, &next, 8).unwrap();
            assert!(r["content"].is_string() && r.get("tool_calls").is_none(), "{r}");
        }
        // No tools: content only.
        let r = reply(engine, &json!({"messages": [user]}), 8).unwrap();
        assert!(r["content"].as_str().is_some() && r.get("tool_calls").is_none(), "{r}");
        assert_eq!(r["finish_reason"], "length", "{r}");
        // Refused by name: not JSON, no messages, an unknown tool choice, a function not among
        // the tools.
        for (request, why) in [
            (json!("not an object"), "request_json"),
            (json!({"tools": tools}), "messages"),
            (json!({"messages": [user], "tools": tools, "tool_choice": "sometimes"}), "tool_choice"),
            (
                json!({"messages": [user], "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "nope",
            ),
        ] {
            let e = reply(engine, &request, 8).unwrap_err();
            assert!(e.contains(why), "{request}: {e}");
        }
        assert!(moestream_chat_message(
            engine,
            null_mut(),
            std::ptr::null(),
            std::ptr::null(),
            None,
            null_mut(),
            null_mut()
        )
        .is_null());
        assert!(last_error().contains("request_json"), "{}", last_error());
        moestream_engine_free(engine);
    }
}

#[test]
fn a_forced_harmony_call_comes_back_as_a_tool_call() {
    // gpt-oss's real template on a fixture whose vocabulary lacks harmony's special tokens: the
    // forced call's markers are text, and the reply still reads its channels.
    let model = Templated::new("tests/fixtures/gpt_oss", "openai-gpt-oss-120b");
    let engine = common::load(model.0.to_str().unwrap(), Some(2048));
    unsafe {
        let tools = json!([{"type": "function", "function": {"name": "add", "description": "a + b",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                           "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                           "required": ["a", "b"], "additionalProperties": false}}}]);
        let user = json!({"role": "user", "content": "1 + 2?"});
        let request = json!({"messages": [user], "tools": tools, "tool_choice": "required"});
        let r = reply(engine, &request, 300).unwrap();
        assert_eq!(r["finish_reason"], "tool_calls", "{r}");
        assert_eq!(r["tool_calls"].as_array().map(Vec::len), Some(1), "{r}");
        assert_eq!(r["tool_calls"][0]["function"]["name"], "add", "{r}");
        let args: Value = serde_json::from_str(r["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args["a"].as_i64().is_some_and(|a| (0..=9).contains(&a)) && args["b"].is_i64(), "{r}");
        assert_eq!(r["content"], "", "{r}");
        moestream_engine_free(engine);
    }
}
