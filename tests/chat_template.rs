//! Chat templates rendered by moestream == transformers' `apply_chat_template` on the real
//! templates of Qwen3, Llama 3.2, Mistral Nemo, gpt-oss and DeepSeek V3.1 (fixtures from
//! `tests/fixtures/chat_templates/make_expected.py`), including the conversations a template
//! refuses; the bundled model's template; models without one.

use std::path::{Path, PathBuf};

use moestream::chat::{ChatMessage, ChatTemplate, RenderOptions, Role};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates")
}

#[test]
fn real_templates_render_like_transformers() {
    let dir = fixtures();
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let fixture_day = expected["today"].as_str().unwrap();
    let today = chrono_today();
    let mut checked = 0;
    for r in expected["renderings"].as_array().unwrap() {
        let name = r["template"].as_str().unwrap();
        let case = r["case"].as_str().unwrap();
        let source = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        let token = |k: &str| r[k].as_str().map(str::to_string);
        let template = ChatTemplate::new(source, token("bos_token"), token("eos_token")).unwrap();
        let messages: Vec<ChatMessage> = serde_json::from_value(r["messages"].clone()).unwrap();
        let options = RenderOptions {
            add_generation_prompt: r["add_generation_prompt"].as_bool().unwrap(),
            tools: r["tools"].as_array().cloned(),
            variables: r["extra"].as_object().cloned().unwrap(),
        };
        let got = template.render(&messages, &options);
        match (r.get("expected"), got) {
            (Some(want), Ok(got)) => {
                let want = want.as_str().unwrap().replace(fixture_day, &today);
                assert_eq!(got, want, "{name} / {case}");
            }
            (None, Err(e)) => {
                assert!(e.to_string().starts_with("chat template:"), "{name} / {case}: {e}");
            }
            (Some(_), Err(e)) => panic!("{name} / {case}: transformers renders it, moestream fails: {e}"),
            (None, Ok(got)) => {
                panic!("{name} / {case}: transformers refuses ({}), moestream renders {got:?}", r["error"])
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 30);
}

/// Today's date as the gpt-oss template prints it (`strftime_now("%Y-%m-%d")`, local time).
fn chrono_today() -> String {
    let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", None, None).unwrap();
    t.render(&[], &RenderOptions::default()).unwrap()
}

#[test]
fn bundled_model_has_a_template_ending_turns_with_end_of_text() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe");
    let t = ChatTemplate::from_dir(&dir).unwrap().expect("the bundled model ships chat_template.jinja");
    let messages = [ChatMessage::new(Role::System, "Be brief."), ChatMessage::new(Role::User, " Hello ")];
    let prompt = t.render(&messages, &RenderOptions { add_generation_prompt: true, ..Default::default() }).unwrap();
    assert_eq!(prompt, "System: Be brief.<|endoftext|>User: Hello<|endoftext|>Assistant:");
}

#[test]
fn templates_come_from_tokenizer_config_and_missing_ones_are_none() {
    let dir = std::env::temp_dir().join(format!("moestream-chat-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"eos_token": {"content": "</s>"}}"#).unwrap();
    assert!(ChatTemplate::from_dir(&dir).unwrap().is_none());
    let config = r#"{"eos_token": {"content": "</s>"}, "chat_template": [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}]}"#;
    std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
    let t = ChatTemplate::from_dir(&dir).unwrap().unwrap();
    assert_eq!(t.render(&[ChatMessage::new(Role::User, "hi")], &RenderOptions::default()).unwrap(), "hi</s>");
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"chat_template": "{% if %}"}"#).unwrap();
    let err = ChatTemplate::from_dir(&dir).err().expect("a syntax error is refused");
    assert!(err.to_string().starts_with("chat template:"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn messages_parse_openai_shapes_and_refuse_unknown_roles() {
    let m: ChatMessage = serde_json::from_str(r#"{"role": "assistant", "content": null, "tool_calls": []}"#).unwrap();
    assert_eq!((m.role, m.content.as_str()), (Role::Assistant, ""));
    assert!(m.extra.contains_key("tool_calls"));
    let m: ChatMessage = serde_json::from_str(
        r#"{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}"#,
    )
    .unwrap();
    assert_eq!(m.content, "ab");
    assert!(serde_json::from_str::<ChatMessage>(r#"{"role": "robot", "content": "x"}"#).is_err());
    assert!(serde_json::from_str::<ChatMessage>(r#"{"role": "user", "content": 5}"#).is_err());
}
