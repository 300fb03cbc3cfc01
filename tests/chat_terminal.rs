//! `moestream chat` at a terminal, driven through a pseudo-terminal as a person types: a line
//! edited before it is sent, the previous turn recalled with the up arrow, a `"""` block of
//! several lines, Ctrl-C stopping a reply (the next turn then reuses every cached token), an
//! unknown command refused, `/save` then `/load` continuing the conversation, Ctrl-D ending it,
//! and the history saved in the cache directory.

#![cfg(unix)]

mod common;

use std::path::Path;
use std::process::Command;

use common::TempDir;
use rexpect::session::PtySession;

/// Answers the cursor-position query the line editor sends as it starts reading a line (a real
/// terminal would), so that the prompt is drawn.
fn at_prompt(p: &mut PtySession) {
    p.exp_string("\x1b[6n").expect("the line editor asks where the cursor is");
    p.send("\x1b[1;1R").unwrap();
    p.flush().unwrap();
}

/// Types `keys` and Enter at the prompt.
fn enter(p: &mut PtySession, keys: &str) {
    at_prompt(p);
    p.send(keys).unwrap();
    p.send("\r").unwrap();
    p.flush().unwrap();
}

/// `(prompt tokens, reused, generated, stopped)` from the next turn's stats line.
fn turn_stats(p: &mut PtySession) -> (usize, usize, usize, bool) {
    let (_, line) =
        p.exp_regex(r"\[\d+ prompt tokens \(\d+ reused, [^\]]*generated at [^\]]*\]").expect("a turn's stats line");
    let numbers: Vec<usize> =
        line.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    let generated = line.split(" generated").next().unwrap().rsplit(", ").next().unwrap().parse().unwrap();
    (numbers[0], numbers[1], generated, line.contains("stopped"))
}

/// Sends a turn and stops its reply with Ctrl-C once it is under way (the replies are long: up
/// to 1500 tokens); its stats.
fn stopped_turn(p: &mut PtySession, keys: &str) -> (usize, usize, usize, bool) {
    enter(p, keys);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    p.send_control('c').unwrap();
    turn_stats(p)
}

#[test]
fn a_person_at_a_terminal() {
    let cache = TempDir::new("chat_terminal_cache");
    let saved = cache.path().join("conversation.json");
    let mut command = Command::new(env!("CARGO_BIN_EXE_moestream"));
    command
        .args(["chat", "--temperature", "0", "--ignore-eos", "--max-tokens", "1500", "-c", "2048"])
        .env("MOESTREAM_CACHE", cache.path())
        .env("RUST_LOG", "warn");
    let mut p = rexpect::session::spawn_command(command, Some(60_000)).unwrap();
    p.exp_string("Chatting with").unwrap();

    // A typo mended with backspace before Enter; the reply stopped by Ctrl-C.
    let (first_prompt, _, first_generated, stopped) = stopped_turn(&mut p, "Hello therx\x7fe");
    assert!(stopped, "Ctrl-C stops the reply");
    // The up arrow brings the last turn back; sent again, it continues the conversation, all of
    // whose cached tokens (but the stopped reply's last) are reused.
    let (prompt, reused, generated, _) = stopped_turn(&mut p, "\x1b[A");
    assert!(reused + 1 >= first_prompt + first_generated, "reused {reused} of {first_prompt} + {first_generated}");
    // Several lines in a `"""` block are one turn.
    let (_, reused, _, _) = stopped_turn(&mut p, "\"\"\"\rline one\rline two\r\"\"\"");
    assert!(reused + 1 >= prompt + generated, "reused {reused} of {prompt} + {generated}");

    enter(&mut p, "/frobnicate");
    p.exp_string("error: unknown command /frobnicate").unwrap();
    enter(&mut p, &format!("/save {}", saved.display()));
    p.exp_string("[saved 6 messages").unwrap();
    let conversation: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let messages = conversation["messages"].as_array().unwrap();
    assert_eq!(messages[0]["content"], "Hello there");
    assert_eq!(messages[2]["content"], "Hello there");
    assert_eq!(messages[4]["content"], "line one\nline two");

    // Forgotten, then loaded back: the next turn continues it (its prefix still cached).
    enter(&mut p, "/reset");
    p.exp_string("[conversation cleared]").unwrap();
    enter(&mut p, &format!("/load {}", saved.display()));
    p.exp_string("[loaded 6 messages").unwrap();
    let (prompt, reused, _, _) = stopped_turn(&mut p, "And then?");
    assert!(prompt > reused && reused > prompt / 2, "the loaded conversation's prefix is reused: {reused} of {prompt}");

    // Ctrl-D at the prompt ends the chat.
    at_prompt(&mut p);
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();

    // The history file holds the turns typed.
    let history_dir = cache.path().join("chat-history");
    let files: Vec<_> = std::fs::read_dir(&history_dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "one history file for the model: {files:?}");
    let history = std::fs::read_to_string(&files[0]).unwrap();
    assert!(history.contains("Hello there") && history.contains("/frobnicate"), "{history}");
    assert!(Path::new(&files[0]).file_name().unwrap().to_string_lossy().starts_with("moestream-tiny-moe-"));
}
