//! `moestream_chat_message`: a chat reply as an OpenAI assistant message, with tools, tool
//! calls parsed out of the reply (or forced) and a thinking model's reasoning apart.

use std::ffi::{c_char, c_void};

use moestream::chat::{is_harmony, thinking_start, ChatMessage, RenderOptions, ToolChoice};
use moestream::Error;
use serde_json::{json, Value};

use crate::boundary::{guard, owned_string, str_arg};
use crate::engine::{engine_ref, MoestreamEngine};
use crate::generate::{chat_request, complete_in, MoestreamGenerateOptions, MoestreamStats, MoestreamTokenCallback};
use crate::session::MoestreamSession;
use crate::sized;

/// Replies to the chat request `request_json`, OpenAI's shape: `{"messages": [...], "tools":
/// [...], "tool_choice": "auto" | "none" | "required" | {"type": "function", "function":
/// {"name": ...}}}` (`tools` and `tool_choice` optional; messages as `moestream_chat`'s, an
/// assistant message may carry its `tool_calls` and a `"tool"` message answers one). Returns
/// the reply as an assistant message in JSON (free with `moestream_string_free`), or NULL on
/// failure: `{"role": "assistant", "content": "...", "reasoning_content": "..." (a thinking
/// model's, when its template writes `<think>` or gpt-oss's analysis channel), "tool_calls":
/// [{"id", "type": "function", "function": {"name", "arguments"}}] (calls the model wrote in its
/// template's format; with `tool_choice` `"required"` or a named function the reply is such a
/// call, by constrained decoding), "finish_reason": "stop" | "length" | "tool_calls" |
/// "cancelled"}`. `callback` gets the content as it is generated (`token` is `UINT32_MAX`); the
/// session is used as by `moestream_chat`.
///
/// # Safety
/// As `moestream_chat`; `request_json` NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn moestream_chat_message(
    engine: *mut MoestreamEngine,
    session: *mut MoestreamSession,
    request_json: *const c_char,
    options: *const MoestreamGenerateOptions,
    callback: MoestreamTokenCallback,
    user_data: *mut c_void,
    stats: *mut MoestreamStats,
) -> *mut c_char {
    guard(std::ptr::null_mut(), || {
        sized::check_output(stats)?;
        let e = engine_ref(engine)?;
        let bad = |why: String| Error::InvalidArgument(format!("request_json: {why}"));
        let request: Value =
            serde_json::from_str(str_arg(request_json, "request_json")?).map_err(|e| bad(e.to_string()))?;
        let Value::Object(mut request) = request else { return Err(bad("not a JSON object".into())) };
        let messages = request.remove("messages").ok_or_else(|| bad("no messages".into()))?;
        let messages: Vec<ChatMessage> = serde_json::from_value(messages).map_err(|e| bad(format!("messages: {e}")))?;
        let tools = match request.remove("tools") {
            None | Some(Value::Null) => None,
            Some(Value::Array(tools)) => Some(tools),
            Some(_) => return Err(bad("tools is not a list".into())),
        };
        let choice = ToolChoice::from_json(request.get("tool_choice"))?;
        let template = e.template.as_ref().ok_or_else(|| Error::NoChatTemplate(e.engine.model_dir().into()))?;
        let tokenizer =
            e.engine.tokenizer().ok_or_else(|| Error::Tokenizer("the model has no tokenizer.json".into()))?;
        let render = RenderOptions { add_generation_prompt: true, tools: tools.clone(), ..Default::default() };
        let text = template.render(&messages, &render)?;
        let prompt = e.engine.encode_raw(&text)?;
        let mut request = chat_request(e, options)?;
        if let Some(tools) = &tools {
            request.use_tools(template.source(), tools, &choice, tokenizer)?;
        }
        request.reasoning = thinking_start(template.source(), &text);
        request.constrain_after_reasoning(tokenizer);
        request.read_markers(tokenizer, is_harmony(template.source()));
        let c = complete_in(e, session, &prompt, &request, (callback, user_data), stats)?;
        let mut message = json!({"role": "assistant", "content": c.text, "finish_reason": c.finish_reason});
        if !c.reasoning.is_empty() {
            message["reasoning_content"] = json!(c.reasoning);
        }
        if !c.tool_calls.is_empty() {
            let calls: Vec<Value> = c
                .tool_calls
                .iter()
                .map(
                    |t| json!({"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}),
                )
                .collect();
            message["tool_calls"] = json!(calls);
        }
        Ok(owned_string(message.to_string()))
    })
}
