//! `moestream_chat_message`: a reply as an OpenAI assistant message. On the bundled model with
//! Qwen3's real chat template (Hermes-style `<tool_call>` calls): `tool_choice` `"required"`
//! and a named function force a call whose arguments fit the function's parameters (as
//! `tool_calls`, `finish_reason` `"tool_calls"`); a tool's result goes back as a `"tool"`
//! message; without tools the reply is content; bad requests are refused by name.

use std::ffi::{CStr, CString};
use std::ptr::null_mut;

use moestream_c::*;
use serde_json::{json, Value};

mod common;
use common::last_error;

/// The bundled model with Qwen3's chat template, in a temporary directory (removed on drop).
struct QwenTemplated(std::path::PathBuf);

impl QwenTemplated {
    fn new() -> QwenTemplated {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
        let dir = std::env::temp_dir().join(format!("moestream-chat-message-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"] {
            std::fs::copy(format!("{root}/models/moestream-tiny-moe/{f}"), dir.join(f)).unwrap();
        }
        let template = format!("{root}/tests/fixtures/chat_templates/Qwen-Qwen3-0.6B.jinja");
        std::fs::copy(template, dir.join("chat_template.jinja")).unwrap();
        QwenTemplated(dir)
    }
}

impl Drop for QwenTemplated {
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
    let model = QwenTemplated::new();
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
