//! `moestream chat` driven through a pipe, as a script or another program would: replies stream
//! to stdout, the speed/expert line goes to stderr after each, later turns reuse the session's
//! KV cache, `/system`, `/save`, `/reset` work, a prompt over the context is an error that does not end the conversation, and Ctrl-C
//! (SIGINT) stops a reply without ending the program.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;

fn chat(extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moestream"));
    c.args(["chat", "--temperature", "0", "--context", "256", "--model"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/models/moestream-tiny-moe"))
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[test]
fn piped_conversation_with_commands() {
    let dir = std::env::temp_dir().join(format!("moestream-chat-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let saved = dir.join("conversation.json");
    let script = format!(
        "Hello there\n/system You answer briefly.\nWho are you?\nAnd then?\n{}\n/save {}\n/reset\n/bogus\n",
        "word ".repeat(300),
        saved.display()
    );
    let mut child = chat(&["--max-tokens", "8"]).spawn().unwrap();
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let stats: Vec<&str> = stderr.lines().filter(|l| l.contains(" prompt tokens (")).collect();
    assert_eq!(stats.len(), 3, "one speed line per reply:\n{stderr}");
    let reused = |line: &str| -> usize {
        line.split(" prompt tokens (").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(reused(stats[1]), 0, "a new system message starts over: {}", stats[1]);
    assert!(reused(stats[2]) > 10, "the next turn reuses the session's KV cache: {}", stats[2]);
    assert!(stats.iter().all(|l| l.contains("tok/s") && l.contains("experts: ")), "{stderr}");
    assert!(stderr.contains("[system message set; conversation cleared]"), "{stderr}");
    assert!(stderr.contains("exceeds the context of 256 tokens"), "{stderr}");
    assert!(stderr.contains("[saved 5 messages to"), "{stderr}");
    assert!(stderr.contains("[conversation cleared]") && stderr.contains("commands: /reset"), "{stderr}");
    assert!(stderr.contains("error: unknown command /bogus"), "{stderr}");

    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let messages = saved["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
    assert_eq!(messages[0]["content"], "You answer briefly.");
    assert_eq!(messages[1]["content"], "Who are you?");
    assert_eq!(messages[3]["content"], "And then?");
    let reply = messages[4]["content"].as_str().unwrap();
    assert!(!reply.is_empty());
    assert!(stdout.ends_with(&format!("{reply}\n")), "the saved reply is the last one shown:\n{stdout}");
    assert!(stdout.len() > reply.len() + 2, "both replies are shown:\n{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[cfg(unix)]
#[test]
fn ctrl_c_stops_the_reply_not_the_program() {
    use std::io::Read;
    let mut child = chat(&["--max-tokens", "240", "--ignore-eos"]).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Tell me about the city.\n").unwrap();
    stdin.flush().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    stdin.write_all(b"/quit\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(child.wait().unwrap().success(), "{stderr}");
    let line = stderr.lines().find(|l| l.contains(" prompt tokens (")).expect("a speed line");
    assert!(line.contains(", stopped"), "{line}");
    let generated: usize = line.split(" generated at ").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(generated < 240, "the reply stopped early: {line}");
}

/// A model without a chat template: the error says how to give one, `--chat-template FILE`
/// gives one, and a template file that does not exist is named.
#[test]
fn a_model_without_a_template_takes_one_from_the_command_line() {
    let root = env!("CARGO_MANIFEST_DIR");
    let model = format!("{root}/tests/fixtures/qwen3_moe");
    let template = format!("{root}/tests/fixtures/chat_templates/Qwen-Qwen3-0.6B.jinja");
    let run = |extra: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_moestream"))
            .args(["chat", "--temperature", "0", "--max-tokens", "3", "--model", &model])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(b"Hello\n").unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, stderr) = run(&[]);
    assert!(!ok && stderr.contains("has no chat template") && stderr.contains("--chat-template FILE"), "{stderr}");
    let (ok, stderr) = run(&["--chat-template", &template]);
    assert!(ok && stderr.contains(" prompt tokens ("), "{stderr}");
    let (ok, stderr) = run(&["--chat-template", "/no/such/template.jinja"]);
    assert!(!ok && stderr.contains("/no/such/template.jinja does not exist"), "{stderr}");
}

#[test]
fn tools_from_a_file_give_shown_calls_that_a_tool_result_answers() {
    let dir = std::env::temp_dir().join(format!("moestream-chat-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (tools, saved) = (dir.join("tools.json"), dir.join("conversation.json"));
    let schema = r#"{"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                     "required": ["city"], "additionalProperties": false}"#;
    let tool = format!(r#"[{{"type": "function", "function": {{"name": "get_weather", "parameters": {schema}}}}}]"#);
    std::fs::write(&tools, tool).unwrap();
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates/Qwen-Qwen3-0.6B.jinja");
    let mut child = Command::new(env!("CARGO_BIN_EXE_moestream"))
        .args(["chat", "--context", "2048", "--max-tokens", "200", "-s", "1", "--chat-template", template])
        .arg("--tools")
        .arg(&tools)
        .args(["--tool-choice", "get_weather"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = format!("Weather in Paris?\n/tool {{\"sky\": \"clear\"}}\n/save {}\n", saved.display());
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Both replies were forced calls (--tool-choice names the function), shown on stderr.
    let shown: Vec<&str> = stderr.lines().filter(|l| l.starts_with("[tool call call_")).collect();
    assert_eq!(shown.len(), 2, "{stderr}");
    assert!(shown.iter().all(|l| l.contains(": get_weather({\"city\":")), "{stderr}");
    let conversation: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let m = conversation["messages"].as_array().unwrap();
    assert_eq!(m.len(), 4, "{conversation}");
    assert_eq!(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!((m[2]["role"].as_str(), m[2]["content"].as_str()), (Some("tool"), Some("{\"sky\": \"clear\"}")));
    assert_eq!(m[2]["tool_call_id"], m[1]["tool_calls"][0]["id"]);
    std::fs::remove_dir_all(&dir).ok();
}
