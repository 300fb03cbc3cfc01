//! `moestream serve` over real HTTP on localhost, as a client sees it: the endpoints, streaming
//! (== the non-streamed reply), stop strings, KV reuse across turns, seeds, concurrent requests on one engine, a client
//! that disconnects mid-stream stopping its generation, and every bad input answered with a 4xx
//! and an OpenAI-style error object while the server keeps running.
#![cfg(feature = "serve")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

const KEY: &str = "test-key";

/// A `moestream serve` process on a free port, killed on drop; `log` collects its stderr.
struct Server {
    child: Child,
    url: String,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    fn start() -> Server {
        Self::start_with_env(&[])
    }

    fn start_with_env(env: &[(&str, &str)]) -> Server {
        Self::start_with(env, &[])
    }

    /// A server with `env` and the further command-line `args`.
    fn start_with(env: &[(&str, &str)], args: &[&str]) -> Server {
        Self::start_on(concat!(env!("CARGO_MANIFEST_DIR"), "/models/moestream-tiny-moe"), env, args)
    }

    /// A server of the model in `model`, with `env` and the further command-line `args`.
    fn start_on(model: &str, env: &[(&str, &str)], args: &[&str]) -> Server {
        let context: &[&str] = if args.contains(&"--context") { &[] } else { &["--context", "256"] };
        let mut child = Command::new(env!("CARGO_BIN_EXE_moestream"))
            .args(["serve", "--port", "0", "--max-body", "64KiB", "--api-key", KEY, "--model", model])
            .args(context)
            .args(args)
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("moestream serve starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut before = Vec::new();
        let url = loop {
            let line = lines.next().expect("serve prints its address").unwrap();
            if let Some(addr) = line.strip_prefix("listening on ") {
                break addr.trim().to_string();
            }
            before.push(line);
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        let log = std::sync::Arc::new(std::sync::Mutex::new(before));
        let sink = log.clone();
        std::thread::spawn(move || lines.map_while(|l| l.ok()).for_each(|l| sink.lock().unwrap().push(l)));
        Server { child, url, log }
    }

    fn get(&self, path: &str, auth: bool) -> (u16, String) {
        let mut req = ureq::get(&format!("{}{path}", self.url));
        if auth {
            req = req.set("Authorization", &format!("Bearer {KEY}"));
        }
        answer(req.call())
    }

    fn post(&self, path: &str, body: &str) -> (u16, String) {
        let req = ureq::post(&format!("{}{path}", self.url))
            .set("Authorization", &format!("Bearer {KEY}"))
            .set("Content-Type", "application/json");
        answer(req.send_string(body))
    }

    fn post_json(&self, path: &str, body: Value) -> Value {
        let (status, text) = self.post(path, &body.to_string());
        assert_eq!(status, 200, "{path} {body}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.get("/metrics", true);
        let line =
            text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name} in {text}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn answer(r: Result<ureq::Response, ureq::Error>) -> (u16, String) {
    match r {
        Ok(resp) => (resp.status(), resp.into_string().unwrap()),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap()),
        Err(e) => panic!("transport error: {e}"),
    }
}

/// Writes `request` as is and reads one response: its status and body.
fn raw_exchange(addr: &str, request: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = tcp.write_all(request.as_bytes());
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap())
                })
                .expect("the error response has a Content-Length");
            if got.len() >= end + 4 + length {
                let status = text[9..12].parse().unwrap();
                return (status, text[end + 4..end + 4 + length].to_string());
            }
        }
        let n = tcp.read(&mut buf).expect("the server answers");
        assert!(n > 0, "connection closed before a full response: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// The JSON objects of an SSE body, and whether it ended with `data: [DONE]`.
/// Posts streamed completion `body` to the server at `addr` by hand and hangs up once the
/// first event arrives.
fn leave_mid_stream(addr: &str, body: &str) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let n = tcp.read(&mut buf).unwrap();
        assert!(n > 0, "the stream started");
        seen.extend_from_slice(&buf[..n]);
    }
}

fn sse_events(body: &str) -> (Vec<Value>, bool) {
    let data: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    let done = data.last() == Some(&"[DONE]");
    (data.iter().filter(|d| **d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect(), done)
}

#[test]
fn openai_compatible_server() {
    let server = Server::start();

    // Health, models, auth.
    assert_eq!(server.get("/health", false), (200, r#"{"status":"ok"}"#.to_string()));
    let (status, text) = server.get("/v1/models", false);
    assert_eq!(status, 401, "{text}");
    assert_eq!(server.get("/metrics", false).0, 401, "/metrics is behind the key too");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["code"], "invalid_api_key");
    let (status, text) = server.get("/v1/models", true);
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(models["data"][0]["id"], "moestream-tiny-moe");

    // A text completion, whole and streamed: the same greedy text.
    let body = json!({"model": "m", "prompt": "The jury said", "max_tokens": 10, "temperature": 0, "ignore_eos": true});
    let whole = server.post_json("/v1/completions", body.clone());
    assert_eq!(whole["object"], "text_completion");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["completion_tokens"], 10);
    let completion = whole["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(!completion.is_empty());
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, text) = server.post("/v1/completions", &streamed.to_string());
    assert_eq!(status, 200);
    let (events, done) = sse_events(&text);
    assert!(done, "the stream ends with [DONE]: {text}");
    let joined: String = events.iter().map(|e| e["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(joined, completion);
    assert_eq!(events.last().unwrap()["choices"][0]["finish_reason"], "length");

    // A stop string cuts the text before it.
    let cut = completion.char_indices().nth(completion.chars().count() / 2).unwrap().0;
    let stop = completion[cut..].chars().take(3).collect::<String>();
    let mut stopped = body.clone();
    stopped["stop"] = json!([stop]);
    let r = server.post_json("/v1/completions", stopped);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert_eq!(r["choices"][0]["text"].as_str().unwrap(), &completion[..completion.find(&stop).unwrap()]);

    // Chat: the template's prompt, a reply, the same reply streamed (with role, finish, usage).
    let chat = json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who won?"}],
                      "max_tokens": 12, "temperature": 0});
    let r = server.post_json("/v1/chat/completions", chat.clone());
    assert_eq!(r["object"], "chat.completion");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant");
    let reply = r["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let finish = r["choices"][0]["finish_reason"].clone();
    assert!(finish == "stop" || finish == "length", "{r}");
    let (p, c) = (r["usage"]["prompt_tokens"].as_u64().unwrap(), r["usage"]["completion_tokens"].as_u64().unwrap());
    assert!(p > 8 && (1..=12).contains(&c), "{r}");
    assert_eq!(r["usage"]["total_tokens"].as_u64().unwrap(), p + c);
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, text) = server.post("/v1/chat/completions", &streamed.to_string());
    assert_eq!(status, 200);
    let (events, done) = sse_events(&text);
    assert!(done);
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let joined: String =
        events.iter().filter_map(|e| e["choices"].get(0)?["delta"]["content"].as_str().map(str::to_string)).collect();
    assert_eq!(joined, reply);
    let n = events.len();
    assert_eq!(events[n - 2]["choices"][0]["finish_reason"], finish);
    assert_eq!(events[n - 1]["usage"], r["usage"]);

    // The next turn of that conversation reuses the KV cache of the turns before.
    let reused_before = server.metric("moestream_reused_prompt_tokens_total");
    let mut next = chat.clone();
    next["messages"]
        .as_array_mut()
        .unwrap()
        .extend([json!({"role": "assistant", "content": reply}), json!({"role": "user", "content": "And then?"})]);
    server.post_json("/v1/chat/completions", next);
    let reused = server.metric("moestream_reused_prompt_tokens_total") - reused_before;
    assert!(reused >= p as f64 - 1.0, "the follow-up reuses the first turn's {p} prompt tokens, reused {reused}");

    // Seeds make sampling reproducible.
    let sampled = json!({"prompt": "The jury said", "max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "seed": 42, "ignore_eos": true});
    let a = server.post_json("/v1/completions", sampled.clone());
    let b = server.post_json("/v1/completions", sampled);
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    // Absent sampling fields take the model's defaults (the bundled model's generation_config.json:
    // llama.cpp's settings), not OpenAI's temperature 1.
    let unset = json!({"prompt": "The jury said", "max_tokens": 12, "seed": 42, "ignore_eos": true});
    let spelled = json!({"prompt": "The jury said", "max_tokens": 12, "seed": 42, "ignore_eos": true,
                         "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.1});
    let unset = server.post_json("/v1/completions", unset)["choices"][0]["text"].clone();
    assert_eq!(unset, server.post_json("/v1/completions", spelled)["choices"][0]["text"]);

    // Concurrent requests queue on the one engine and each gets its own, correct reply.
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| server.post_json("/v1/completions", body.clone()))).collect();
        for h in handles {
            assert_eq!(h.join().unwrap()["choices"][0]["text"].as_str().unwrap(), completion);
        }
    });

    // A client that disconnects mid-stream stops its generation.
    let generated_before = server.metric("moestream_generated_tokens_total");
    let cancelled_before = server.metric("moestream_requests_cancelled_total");
    let long =
        json!({"prompt": "The jury said", "max_tokens": 250, "temperature": 0, "ignore_eos": true, "stream": true})
            .to_string();
    leave_mid_stream(server.url.strip_prefix("http://").unwrap(), &long);
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.metric("moestream_requests_cancelled_total") == cancelled_before {
        assert!(Instant::now() < deadline, "the disconnected request was never cancelled");
        std::thread::sleep(Duration::from_millis(50));
    }
    let generated = server.metric("moestream_generated_tokens_total") - generated_before;
    assert!(generated < 250.0, "generation stopped early after the disconnect ({generated} tokens)");

    // Bad input: a 4xx with an OpenAI error object, never a crash.
    let words = "word ".repeat(400);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("/v1/completions", "{\"prompt\": ".into(), 400, "invalid_json"),
        ("/v1/completions", "{\"prompt\": \"x\"} trailing".into(), 400, "invalid_json"),
        ("/v1/completions", json!({"prompt": "x", "max_tokens": "ten"}).to_string(), 400, "invalid_type"),
        ("/v1/completions", json!({"prompt": "x", "temperature": "hot"}).to_string(), 400, "invalid_type"),
        ("/v1/completions", json!({"prompt": 5}).to_string(), 400, "invalid_type"),
        ("/v1/completions", json!({"max_tokens": 3}).to_string(), 400, "invalid_type"),
        ("/v1/completions", json!({"prompt": "x", "temperature": 5}).to_string(), 400, "invalid_value"),
        ("/v1/completions", json!({"prompt": "x", "top_p": 0}).to_string(), 400, "invalid_value"),
        ("/v1/completions", json!({"prompt": "x", "max_tokens": 0}).to_string(), 400, "invalid_value"),
        ("/v1/completions", json!({"prompt": [[1, 2], [3]]}).to_string(), 400, "unsupported_parameter"),
        ("/v1/completions", json!({"prompt": "x", "n": 0}).to_string(), 400, "invalid_value"),
        ("/v1/completions", json!({"prompt": "x", "n": 9}).to_string(), 400, "invalid_value"),
        ("/v1/completions", json!({"prompt": "x", "logit_bias": {"5": 1}}).to_string(), 400, "unsupported_parameter"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}).to_string(),
            400,
            "invalid_value",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "f"}}})
                .to_string(),
            400,
            "invalid_value",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "echo": true, "stream": true}).to_string(),
            400,
            "unsupported_parameter",
        ),
        ("/v1/completions", json!({"prompt": ""}).to_string(), 400, "empty_prompt"),
        ("/v1/completions", json!({"prompt": [999999]}).to_string(), 400, "invalid_token"),
        ("/v1/completions", json!({"prompt": words}).to_string(), 400, "context_length_exceeded"),
        ("/v1/chat/completions", json!({"messages": "hi"}).to_string(), 400, "invalid_type"),
        ("/v1/chat/completions", json!({"messages": []}).to_string(), 400, "invalid_value"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "robot", "content": "x"}]}).to_string(),
            400,
            "invalid_type",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": 3}]}).to_string(),
            400,
            "invalid_type",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": words}]}).to_string(),
            400,
            "context_length_exceeded",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "grammar": "root ::= \"a\""}).to_string(),
            400,
            "unsupported_parameter",
        ),
        ("/v1/nothing", "{}".into(), 404, "not_found"),
    ];
    for (path, body, status, code) in cases {
        let (got, text) = server.post(path, &body);
        let shown = &body[..body.len().min(80)];
        assert_eq!(got, status, "{path} {shown}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path} {shown}: not JSON: {text}"));
        assert_eq!(v["error"]["code"], code, "{path} {shown}: {text}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{text}");
        assert!(v["error"]["type"].is_string(), "{text}");
    }
    // An oversized body is refused from its Content-Length, before it is read. The test sends only
    // the head: a client still writing the rest of an oversized body may find the connection closed
    // under it (a broken pipe instead of the 413, depending on timing), so that is not a case here.
    let addr = server.url.strip_prefix("http://").unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    );
    let (status, text) = raw_exchange(addr, &head);
    assert_eq!(status, 413, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["code"], "request_too_large", "{text}");

    let (status, text) = server.get("/v1/completions", true);
    assert_eq!(status, 405, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["code"], "method_not_allowed");
    let (_, text) = server.post("/v1/completions", &json!({"prompt": "x", "max_tokens": "ten"}).to_string());
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["error"]["param"], "max_tokens");

    // Still serving, and the metrics add up.
    assert_eq!(server.get("/health", false).0, 200);
    assert!(server.metric("moestream_requests_total") >= 10.0);
    assert!(server.metric("moestream_decode_tokens_per_second") > 0.0);
    assert_eq!(server.metric("moestream_queue_depth"), 0.0);
}

/// The server's resident set in bytes (`/proc/PID/statm`).
#[cfg(target_os = "linux")]
fn rss_of(child: &Child) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{}/statm", child.id())).unwrap();
    statm.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4096
}

/// 200 requests, completions and chats, streamed and not, each generating to its limit: the
/// server's resident set after the last is that after the twentieth, within a fixed allowance
/// (the norm_router leak grew it ~10 MiB per generated token; two long requests once had the
/// OOM killer end `serve`).
#[test]
#[cfg(target_os = "linux")]
fn memory_stays_flat_over_200_requests() {
    let server = Server::start();
    let mut after_20 = 0;
    for i in 0..200 {
        let body = match i % 3 {
            0 => json!({"prompt": format!("Request {i}: the jury said"), "max_tokens": 12, "ignore_eos": true}),
            1 => json!({"messages": [{"role": "user", "content": format!("Question {i}?")}], "max_tokens": 12,
                        "ignore_eos": true}),
            _ => json!({"prompt": format!("Streamed {i}:"), "max_tokens": 12, "ignore_eos": true, "stream": true}),
        };
        let path = if i % 3 == 1 { "/v1/chat/completions" } else { "/v1/completions" };
        let (status, text) = server.post(path, &body.to_string());
        assert_eq!(status, 200, "request {i}: {text}");
        if i == 19 {
            after_20 = rss_of(&server.child);
        }
    }
    let after_200 = rss_of(&server.child);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!("serve RSS after 20 requests {:.1} MiB, after 200 {:.1} MiB", mib(after_20), mib(after_200));
    assert!(after_200 <= after_20 + (24 << 20), "serve grew {:.1} MiB over 180 requests", mib(after_200 - after_20));
}

/// `GET /v1/models/{id}` (404 for another id), seeds anywhere in the OpenAI schema's integers
/// (-1 a fresh one, as llama.cpp; others reproducible), and one access-log line per request at
/// `RUST_LOG=info`.
#[test]
fn model_by_id_any_integer_seed_and_an_access_log() {
    let server = Server::start_with_env(&[("RUST_LOG", "info")]);
    let (status, text) = server.get("/v1/models/moestream-tiny-moe", true);
    assert_eq!(status, 200, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["id"], "moestream-tiny-moe");
    let (status, text) = server.get("/v1/models/gpt-4", true);
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("model_not_found"), "{text}");
    let sampled = |seed: i64| {
        let body =
            json!({"prompt": "The jury said", "max_tokens": 8, "temperature": 1.0, "seed": seed, "ignore_eos": true});
        server.post_json("/v1/completions", body)["choices"][0]["text"].as_str().unwrap().to_string()
    };
    assert_eq!(sampled(-5), sampled(-5));
    // The library's range checks answer as 400s naming the value.
    for (field, value, said) in [("presence_penalty", 3.0, "presence penalty"), ("min_p", 1.5, "min-p")] {
        let mut body = json!({"prompt": "Hi", "max_tokens": 2});
        body[field] = json!(value);
        let (status, text) = server.post("/v1/completions", &body.to_string());
        assert!(status == 400 && text.contains(said), "{field}: {status} {text}");
    }
    sampled(-1);
    let wait = Instant::now();
    let logged = loop {
        let lines: Vec<String> =
            server.log.lock().unwrap().iter().filter(|l| l.contains("generated at")).cloned().collect();
        if lines.len() >= 3 || wait.elapsed() > Duration::from_secs(30) {
            break lines;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(logged.len(), 3, "{logged:?}");
    assert!(logged[0].contains("prompt tokens") && logged[0].contains("8 generated"), "{logged:?}");
}

/// The text of a completion reply, streamed (the deltas joined) or not.
fn reply_text(server: &Server, prompt: &str, max_tokens: u32, stream: bool) -> String {
    let body =
        json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true, "stream": stream});
    let (status, text) = server.post("/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{text}");
    match stream {
        false => serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["text"].as_str().unwrap().to_string(),
        true => {
            let (events, done) = sse_events(&text);
            assert!(done);
            events.iter().filter_map(|e| e["choices"][0]["text"].as_str()).collect()
        }
    }
}

#[test]
fn eight_concurrent_clients_get_their_solo_replies() {
    let server = Server::start_with_env(&[("RUST_LOG", "info")]);
    let prompts: Vec<(String, u32)> = (0..8)
        .map(|i| {
            (format!("The story of the {} city began when", ["old", "new", "red", "far"][i % 4]), 12 + i as u32 * 3)
        })
        .collect();
    // Alone, one after another.
    let want: Vec<String> = prompts.iter().map(|(p, n)| reply_text(&server, p, *n, false)).collect();
    // All at once (half of them streamed), beside a client that disconnects mid-stream.
    let addr = server.url.strip_prefix("http://").unwrap().to_string();
    let leaver = std::thread::spawn(move || {
        let long = json!({"prompt": "Once", "max_tokens": 200, "temperature": 0, "ignore_eos": true, "stream": true})
            .to_string();
        leave_mid_stream(&addr, &long);
    });
    let before = (server.metric("moestream_steps_total"), server.metric("moestream_step_sequences_total"));
    let got: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, (p, n))| {
                let server = &server;
                s.spawn(move || reply_text(server, p, *n, i % 2 == 1))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    leaver.join().unwrap();
    assert_eq!(got, want);
    // The replies shared steps: over 1.5 sequences per step on average.
    let steps = server.metric("moestream_steps_total") - before.0;
    let sequences = server.metric("moestream_step_sequences_total") - before.1;
    assert!(sequences > 1.5 * steps, "{sequences} sequences in {steps} steps");
    let log = server.log.lock().unwrap().join("\n");
    assert!(log.contains("4 requests at once"), "{log}");
}

#[test]
fn drafts_give_the_replies_of_one_token_a_step() {
    // Each of four concurrent requests drafts on its own, by prompt lookup (`--speculative ngram
    // --draft-max 4`) or from the bundled model's MTP module (`auto`, the default); the replies
    // are what a server without drafts gives, and drafts are accepted (counted in /metrics):
    // the bundled model's loops for prompt lookup, its trained module for MTP, which accepts
    // more than a third.
    let prompts = ["The history of", "Once upon a time", "The story of the old city began when", "In the year"];
    let plain = Server::start_with(&[], &["--speculative", "off"]);
    let want: Vec<String> = prompts.iter().map(|p| reply_text(&plain, p, 48, false)).collect();
    drop(plain);
    for (args, least) in [(&["--speculative", "ngram", "--draft-max", "4"][..], 0.0), (&[][..], 1.0 / 3.0)] {
        let server = Server::start_with(&[], args);
        let got: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let server = &server;
                    s.spawn(move || reply_text(server, p, 48, i % 2 == 1))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got, want, "{args:?}");
        let (drafted, accepted) =
            (server.metric("moestream_draft_tokens_total"), server.metric("moestream_accepted_draft_tokens_total"));
        assert!(
            accepted > least * drafted && accepted > 0.0 && accepted <= drafted,
            "{args:?}: {accepted} of {drafted} drafts accepted"
        );
    }
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/models/moestream-tiny-moe");
    let bad = Command::new(env!("CARGO_BIN_EXE_moestream"))
        .args(["serve", "--model", model, "--port", "0", "--draft-max", "40"])
        .output()
        .unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("draft length 40"));
}

#[test]
fn n_choices_of_one_prompt() {
    let server = Server::start();
    let body = |n: u32, seed: u64, stream: bool| json!({"prompt": "The river", "max_tokens": 10, "temperature": 0.9, "seed": seed, "ignore_eos": true, "n": n, "stream": stream});
    // Choice i samples as a one-choice request with seed + i would.
    let alone: Vec<String> = (0..3)
        .map(|i| {
            server.post_json("/v1/completions", body(1, 40 + i, false))["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let together = server.post_json("/v1/completions", body(3, 40, false));
    let choices = together["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"].as_str().unwrap(), alone[i], "choice {i}");
    }
    assert_eq!(together["usage"]["completion_tokens"], 30);
    // Streamed, each choice's deltas joined by index give the same texts.
    let (status, text) = server.post("/v1/chat/completions", &json!({
        "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0.9, "seed": 5, "n": 2, "stream": true, "ignore_eos": true
    }).to_string());
    assert_eq!(status, 200, "{text}");
    let (events, done) = sse_events(&text);
    assert!(done);
    let mut streamed = [String::new(), String::new()];
    let mut finished = 0;
    for e in &events {
        let c = &e["choices"][0];
        let i = c["index"].as_u64().unwrap() as usize;
        streamed[i] += c["delta"]["content"].as_str().unwrap_or("");
        finished += c["finish_reason"].is_string() as usize;
    }
    assert_eq!(finished, 2);
    let whole = server.post_json("/v1/chat/completions", json!({
        "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0.9, "seed": 5, "n": 2, "ignore_eos": true
    }));
    for i in 0..2 {
        assert_eq!(whole["choices"][i]["message"]["content"].as_str().unwrap(), streamed[i]);
    }
}

#[test]
fn logprobs_of_generated_tokens() {
    let server = Server::start();
    // Completions: `logprobs: N` gives tokens, their log-probabilities and the top N.
    let r = server.post_json(
        "/v1/completions",
        json!({"prompt": "The jury said", "max_tokens": 6, "temperature": 0, "ignore_eos": true, "logprobs": 2}),
    );
    let lp = &r["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 6);
    assert_eq!(
        tokens.iter().map(|t| t.as_str().unwrap()).collect::<String>(),
        r["choices"][0]["text"].as_str().unwrap()
    );
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 2);
        let best = top.iter().max_by(|a, b| a.1.as_f64().partial_cmp(&b.1.as_f64()).unwrap()).unwrap();
        assert_eq!(best.0, tokens[i].as_str().unwrap(), "greedy takes the most likely token");
        assert!((best.1.as_f64().unwrap() - lp["token_logprobs"][i].as_f64().unwrap()).abs() < 1e-6);
    }
    // Chat: `logprobs: true` and `top_logprobs`, whole and streamed.
    let body = |stream: bool| {
        json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5, "temperature": 0,
               "ignore_eos": true, "logprobs": true, "top_logprobs": 3, "stream": stream})
    };
    let whole = server.post_json("/v1/chat/completions", body(false));
    let content = whole["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len(), 5);
    assert!(content
        .iter()
        .all(|c| c["top_logprobs"].as_array().unwrap().len() == 3 && c["logprob"].as_f64().unwrap() <= 0.0));
    let (status, text) = server.post("/v1/chat/completions", &body(true).to_string());
    assert_eq!(status, 200);
    let (events, _) = sse_events(&text);
    let streamed: Vec<Value> =
        events.iter().filter_map(|e| e["choices"][0]["logprobs"]["content"].as_array().cloned()).flatten().collect();
    assert_eq!(streamed, content, "the stream's pieces carry the same log-probabilities");
    // lm-evaluation-harness's loglikelihood request: the prompt echoed with its tokens'
    // log-probabilities (the first has none), then the generated token's.
    for max_tokens in [0, 1] {
        let r = server.post_json(
            "/v1/completions",
            json!({"prompt": "The jury said it", "max_tokens": max_tokens, "echo": true, "logprobs": 1, "temperature": 0}),
        );
        let c = &r["choices"][0];
        assert!(c["text"].as_str().unwrap().starts_with("The jury said it"), "{c}");
        let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
        let prompt_tokens = r["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
        assert_eq!(lps.len(), prompt_tokens + max_tokens);
        assert!(lps[0].is_null() && c["logprobs"]["top_logprobs"][0].is_null());
        assert!(lps[1..].iter().all(|l| l.as_f64().unwrap() <= 0.0));
        for (i, top) in c["logprobs"]["top_logprobs"].as_array().unwrap().iter().enumerate().skip(1) {
            let best = top.as_object().unwrap().values().next().unwrap().as_f64().unwrap();
            assert!(lps[i].as_f64().unwrap() <= best + 1e-6, "no token beats the most likely one");
        }
    }
    // A one-token prompt echoes its token (null log-probability), also given as lm-eval's
    // default shape, a batch of one token-id list.
    let ids = server.post_json("/v1/completions", json!({"prompt": "The", "max_tokens": 1, "temperature": 0}))["usage"]
        ["prompt_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(ids, 1, "\"The\" is one token of the bundled model");
    for prompt in [json!("The"), json!([[474]])] {
        for max_tokens in [0, 1] {
            let r = server.post_json(
                "/v1/completions",
                json!({"prompt": prompt, "max_tokens": max_tokens, "echo": true, "logprobs": 1, "temperature": 0}),
            );
            let lp = &r["choices"][0]["logprobs"];
            assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 1 + max_tokens, "{prompt} {max_tokens}: {lp}");
            assert!(lp["token_logprobs"][0].is_null() && lp["tokens"][0] == "The", "{lp}");
        }
    }
    // More stop strings than OpenAI's 4 (evaluation harnesses add the end-of-text string), not
    // more than 16.
    let stops = |n: usize| (0..n).map(|i| format!("<stop{i}>")).collect::<Vec<_>>();
    server.post_json("/v1/completions", json!({"prompt": "x", "max_tokens": 2, "stop": stops(16)}));
    let (status, text) = server.post("/v1/completions", &json!({"prompt": "x", "stop": stops(17)}).to_string());
    assert!(status == 400 && text.contains("at most 16"), "{status} {text}");
    let (status, _) = server.post("/v1/completions", &json!({"prompt": "x", "echo": true, "stream": true}).to_string());
    assert_eq!(status, 400, "echo with stream is refused by name");
    // Without them asked for: null.
    let plain = server.post_json("/v1/completions", json!({"prompt": "x", "max_tokens": 2}));
    assert!(plain["choices"][0]["logprobs"].is_null());
    for (path, bad) in [
        ("/v1/completions", json!({"prompt": "x", "logprobs": 21})),
        ("/v1/completions", json!({"prompt": "x", "logprobs": true})),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "logprobs": 3})),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})),
    ] {
        let (status, text) = server.post(path, &bad.to_string());
        assert_eq!(status, 400, "{bad}: {text}");
    }
}

#[test]
fn structured_outputs_and_forced_tool_calls() {
    // Qwen3's real template, which writes Hermes-style `<tool_call>` calls.
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates/Qwen-Qwen3-0.6B.jinja");
    let server = Server::start_with(&[], &["--chat-template", template, "--context", "2048"]);
    let schema = json!({"type": "object", "properties": {"verdict": {"enum": ["guilty", "not guilty"]},
                        "votes": {"type": "integer", "minimum": 0, "maximum": 12}},
                        "required": ["verdict", "votes"], "additionalProperties": false});
    let ask = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "What did the jury say?"}], "max_tokens": 200,
                              "temperature": 0.7, "seed": 3});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        server.post_json("/v1/chat/completions", body)
    };
    // OpenAI's response_format, llama-server's json_schema and vLLM's guided_json: JSON that
    // follows the schema.
    for extra in [
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema, "strict": true}}}),
        json!({"json_schema": schema}),
        json!({"guided_json": schema}),
    ] {
        let r = ask(extra.clone());
        let content = r["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        let value: Value = serde_json::from_str(&content).unwrap_or_else(|e| panic!("{extra}: {content:?}: {e}"));
        assert!(value["verdict"] == "guilty" || value["verdict"] == "not guilty", "{content}");
        assert!(value["votes"].as_u64().is_some_and(|v| v <= 12), "{content}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    }
    let r = ask(json!({"guided_choice": ["yes", "no"]}));
    assert!(["yes", "no"].contains(&r["choices"][0]["message"]["content"].as_str().unwrap()), "{r}");
    // Any object (unbounded: a model this small may write until the token limit).
    let r = ask(json!({"response_format": {"type": "json_object"}}));
    assert!(r["choices"][0]["message"]["content"].as_str().unwrap().starts_with('{'), "{r}");

    // tool_choice "required" and a named function: a call comes back as tool_calls, its
    // arguments valid for the function's parameters.
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                        "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
         "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "integer", "minimum": -99, "maximum": 99}},
         "required": ["a", "b"], "additionalProperties": false}}}
    ]);
    for (choice, names) in [
        (json!("required"), vec!["get_weather", "add"]),
        (json!({"type": "function", "function": {"name": "add"}}), vec!["add"]),
    ] {
        for stream in [false, true] {
            let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
                              "tool_choice": choice, "max_tokens": 200, "seed": 1, "stream": stream});
            let (status, text) = server.post("/v1/chat/completions", &body.to_string());
            assert_eq!(status, 200, "{text}");
            let calls = match stream {
                false => serde_json::from_str::<Value>(&text).unwrap()["choices"][0]["message"]["tool_calls"].clone(),
                true => {
                    let (events, _) = sse_events(&text);
                    events
                        .iter()
                        .find_map(|e| e["choices"][0]["delta"].get("tool_calls").cloned())
                        .unwrap_or(Value::Null)
                }
            };
            let call = &calls[0]["function"];
            let name = call["name"].as_str().unwrap_or_else(|| panic!("{choice} {stream}: {text}"));
            assert!(names.contains(&name), "{name}");
            let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
            match name {
                "add" => assert!(args["a"].is_i64() && args["b"].is_i64(), "{args}"),
                _ => assert!(args["city"].is_string(), "{args}"),
            }
        }
    }

    // Llama 3.2's real template: a call is the whole reply, `{"name": ..., "parameters": ...}`.
    let llama =
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat_templates/meta-llama-Llama-3.2-3B-Instruct.jinja");
    let llama = Server::start_with(&[], &["--chat-template", llama, "--context", "2048"]);
    let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
                      "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 200, "seed": 1});
    let r = llama.post_json("/v1/chat/completions", body);
    let call = &r["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{r}");
    assert!(serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap()["city"].is_string(), "{r}");
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{r}");
    drop(llama);

    // Refusals name the field.
    for (body, field) in [
        (json!({"grammar": "root ::= \"a\""}), "grammar"),
        (json!({"json_schema": {"type": "wat"}}), "JSON schema"),
        (json!({"guided_regex": "(", "max_tokens": 2}), "regex"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "nope"),
        (json!({"tools": tools, "tool_choice": "required", "json_schema": schema}), "tool_choice"),
    ] {
        let mut full = json!({"messages": [{"role": "user", "content": "x"}]});
        full.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        let (status, text) = server.post("/v1/chat/completions", &full.to_string());
        assert!(status == 400 && text.contains(field), "{body}: {status} {text}");
    }
}

#[test]
fn forced_tool_calls_in_special_token_formats() {
    // DeepSeek-V3.1's and gpt-oss's real templates on fixture models whose vocabularies have
    // the formats' marker tokens: the grammar writes the tokens, the reply reads them back.
    // (gpt-oss's template wants every tool described.)
    let deepseek = common::DEEPSEEK_TOOL_MARKERS;
    let harmony: &[&str] =
        &["<|channel|>", "<|message|>", "<|constrain|>", "<|call|>", "<|start|>", "<|end|>", "<|return|>"];
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                        "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {"type": "object",
         "properties": {"a": {"type": "integer", "minimum": -99, "maximum": 99}, "b": {"type": "integer", "minimum": -99, "maximum": 99}},
         "required": ["a", "b"], "additionalProperties": false}}}
    ]);
    for (fixture, template, markers) in
        [("deepseek_v3", "deepseek-ai-DeepSeek-V3.1", deepseek), ("gpt_oss", "openai-gpt-oss-120b", harmony)]
    {
        let (dir, _) = common::with_special_tokens(&common::fixtures_dir().join(fixture), markers);
        let template = common::fixtures_dir().join(format!("chat_templates/{template}.jinja"));
        let server = Server::start_on(
            dir.path().to_str().unwrap(),
            &[],
            &["--chat-template", template.to_str().unwrap(), "--context", "1024"],
        );
        // DeepSeek-V3.1 thinking leaves the prompt inside `<think>`: the call closes it first.
        let thinking = json!({"thinking": true});
        for (choice, names, kwargs) in [
            (json!("required"), vec!["get_weather", "add"], json!({})),
            (json!({"type": "function", "function": {"name": "add"}}), vec!["add"], json!({})),
            (json!("required"), vec!["get_weather", "add"], thinking),
        ] {
            for stream in [false, true] {
                let what = format!("{fixture} {choice} {kwargs} stream {stream}");
                let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools,
                                  "tool_choice": choice, "max_tokens": 300, "seed": 5, "stream": stream,
                                  "chat_template_kwargs": kwargs});
                let (status, text) = server.post("/v1/chat/completions", &body.to_string());
                assert_eq!(status, 200, "{what}: {text}");
                let (calls, finish) = match stream {
                    false => {
                        let r: Value = serde_json::from_str(&text).unwrap();
                        assert_eq!(r["choices"][0]["message"]["content"].as_str().unwrap_or(""), "", "{what}: {text}");
                        assert!(r["choices"][0]["message"].get("reasoning_content").is_none(), "{what}: {text}");
                        (r["choices"][0]["message"]["tool_calls"].clone(), r["choices"][0]["finish_reason"].clone())
                    }
                    true => {
                        let (events, done) = sse_events(&text);
                        assert!(done, "{what}: {text}");
                        let calls = events.iter().find_map(|e| e["choices"][0]["delta"].get("tool_calls").cloned());
                        let finish =
                            events.iter().find_map(|e| e["choices"][0]["finish_reason"].as_str().map(Value::from));
                        (calls.unwrap_or(Value::Null), finish.unwrap_or(Value::Null))
                    }
                };
                assert_eq!(finish, "tool_calls", "{what}: {text}");
                assert_eq!(calls.as_array().map(Vec::len), Some(1), "{what}: {text}");
                let call = &calls[0]["function"];
                let name = call["name"].as_str().unwrap_or_else(|| panic!("{what}: {text}"));
                assert!(names.contains(&name), "{what}: {name}");
                let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
                match name {
                    "add" => assert!(
                        args["a"].is_i64() && args["b"].is_i64() && args.as_object().unwrap().len() == 2,
                        "{args}"
                    ),
                    _ => assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 20), "{args}"),
                }
            }
        }
    }
}
