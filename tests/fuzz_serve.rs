//! Hostile HTTP requests to `moestream serve` never panic it, hang it or get a malformed
//! answer: seeded proptest mutants of `/v1/chat/completions` and `/v1/completions` bodies
//! (hostile values at any node: wrong types, huge numbers, nulls, deep nesting, long strings;
//! invalid UTF-8, cuts, oversized bodies), bad or missing headers (key, content type, length),
//! random paths and methods, and requests that are not HTTP at all. The property: each answer
//! is a well-formed HTTP response, a 2xx or a 4xx with an OpenAI error object (a request hyper
//! cannot parse may get its bare 400 or a closed connection), no panic on the server's stderr,
//! the process alive and `/health` answering afterwards. `MOESTREAM_FUZZ_LONG=1` runs 50× the
//! CI count, `MOESTREAM_FUZZ_CASES=N` exactly N.
#![cfg(feature = "serve")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use serde_json::{json, Value};

const KEY: &str = "fuzz-key";
/// The server's body limit (`--max-body 64KiB`).
const MAX_BODY: usize = 64 << 10;
/// Longest an answer may take before it counts as a hang (generation is capped by the
/// 64-token context).
const HANG: Duration = Duration::from_secs(60);

/// A `moestream serve` process; its stderr lines that report a panic are collected.
struct Server {
    child: Child,
    addr: String,
    panics: Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start() -> Server {
        let model = concat!(env!("CARGO_MANIFEST_DIR"), "/models/moestream-tiny-moe");
        let args =
            ["serve", "--port", "0", "--context", "64", "--max-body", "64KiB", "--api-key", KEY, "--model", model];
        let mut child = Command::new(env!("CARGO_BIN_EXE_moestream"))
            .args(args)
            .env("RUST_BACKTRACE", "0")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("moestream serve starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next().expect("serve prints its address").unwrap();
            if let Some(url) = line.strip_prefix("listening on ") {
                break url.trim().trim_start_matches("http://").to_string();
            }
        };
        let panics = Arc::new(Mutex::new(Vec::new()));
        let seen = panics.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok).filter(|l| l.contains("panicked")) {
                seen.lock().unwrap().push(line);
            }
        });
        Server { child, addr, panics }
    }

    /// Sends `request` and reads the whole answer (the request asks to close the connection;
    /// with `half_close` the client also says it sends nothing more, for requests cut short).
    fn exchange(&self, request: &[u8], half_close: bool) -> Result<Vec<u8>, String> {
        let mut tcp = TcpStream::connect(&self.addr).map_err(|e| format!("connect: {e}"))?;
        tcp.set_read_timeout(Some(HANG)).unwrap();
        let _ = tcp.write_all(request);
        if half_close {
            let _ = tcp.shutdown(std::net::Shutdown::Write);
        }
        let mut got = Vec::new();
        match tcp.read_to_end(&mut got) {
            Ok(_) => Ok(got),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                Err(format!("hang: no complete answer in {HANG:?}"))
            }
            // A reset after a complete answer (the server closed with unread request bytes).
            Err(_) if !got.is_empty() => Ok(got),
            Err(e) => Err(format!("read: {e}")),
        }
    }

    /// Fails when the server died, or printed a panic since the last check.
    fn check_alive(&mut self) -> Result<(), String> {
        if let Some(status) = self.child.try_wait().unwrap() {
            return Err(format!("the server exited: {status}"));
        }
        let panics = std::mem::take(&mut *self.panics.lock().unwrap());
        match panics.is_empty() {
            true => Ok(()),
            false => Err(format!("the server panicked: {panics:?}")),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A parsed answer: status, headers (lower-case names), body (chunked decoded).
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

fn parse_answer(raw: &[u8]) -> Result<Answer, String> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no end of headers")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|s| s.get(..3)?.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut headers = Vec::new();
    for line in lines {
        let (k, v) = line.split_once(':').ok_or_else(|| format!("bad header line {line:?}"))?;
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let rest = &raw[end + 4..];
    let body = if header("transfer-encoding") == Some("chunked") {
        let mut body = Vec::new();
        let mut at = 0;
        loop {
            let eol = rest[at..].windows(2).position(|w| w == b"\r\n").ok_or("cut chunk size")? + at;
            let size = std::str::from_utf8(&rest[at..eol]).ok().and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
            let size = size.ok_or("bad chunk size")?;
            if size == 0 {
                break body;
            }
            body.extend_from_slice(rest.get(eol + 2..eol + 2 + size).ok_or("cut chunk")?);
            at = eol + 4 + size;
        }
    } else {
        let n: usize =
            header("content-length").ok_or("neither a length nor chunks")?.parse().map_err(|_| "bad length")?;
        rest.get(..n).ok_or("body shorter than its Content-Length")?.to_vec()
    };
    Ok(Answer { status, headers, body })
}

/// The property for one answer: a 2xx (a JSON object, an SSE stream or the metrics text) or a
/// 4xx with `{"error": {"message": string, "type": string, "code": ...}}`.
fn check_answer(a: &Answer) -> Result<(), String> {
    let text = String::from_utf8_lossy(&a.body);
    match a.status {
        200..=299 => {
            let content_type = a.headers.iter().find(|(k, _)| k == "content-type").map(|(_, v)| v.as_str());
            match content_type.unwrap_or_default() {
                t if t.starts_with("application/json") => {
                    serde_json::from_slice::<Value>(&a.body).map(|_| ()).map_err(|e| format!("2xx not JSON: {e}"))
                }
                t if t.starts_with("text/event-stream") => match text.trim_end().ends_with("data: [DONE]") {
                    true => Ok(()),
                    false => Err(format!("a stream that does not end with [DONE]: {text}")),
                },
                t if t.starts_with("text/plain") => Ok(()),
                t => Err(format!("2xx of content type {t:?}")),
            }
        }
        400..=499 => {
            let v: Value =
                serde_json::from_slice(&a.body).map_err(|e| format!("{} body not JSON ({e}): {text}", a.status))?;
            let e = &v["error"];
            match e["message"].is_string() && e["type"].is_string() && e.get("code").is_some() {
                true => Ok(()),
                false => Err(format!("{} without an OpenAI error object: {text}", a.status)),
            }
        }
        s => Err(format!("status {s}: {text}")),
    }
}

/// A hostile value for one JSON node.
#[derive(Clone, Debug)]
enum Hostile {
    Delete,
    Value(Value),
    /// Arrays nested this deep.
    Deep(usize),
    /// A string of this many characters.
    Long(usize),
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let values = vec![
        Value::Null,
        json!(0),
        json!(-1),
        json!(1),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e300),
        json!(-0.5),
        json!(""),
        json!("x"),
        json!("\u{0}\u{fffd}\u{1F600}"),
        json!(true),
        json!([]),
        json!({}),
        json!([{"role": "user"}]),
        json!({"role": 7, "content": [1, 2]}),
    ];
    prop_oneof![
        2 => Just(Hostile::Delete),
        6 => prop::sample::select(values).prop_map(Hostile::Value),
        1 => prop::sample::select(vec![64usize, 200, 5000]).prop_map(Hostile::Deep),
        1 => prop::sample::select(vec![300usize, 20_000]).prop_map(Hostile::Long),
    ]
}

/// JSON pointers of every node below the root.
fn nodes(doc: &Value) -> Vec<String> {
    fn walk(v: &Value, path: &str, out: &mut Vec<String>) {
        let children: Vec<(String, &Value)> = match v {
            Value::Object(m) => m.iter().map(|(k, c)| (k.clone(), c)).collect(),
            Value::Array(a) => a.iter().enumerate().map(|(i, c)| (i.to_string(), c)).collect(),
            _ => return,
        };
        for (key, child) in children {
            let p = format!("{path}/{key}");
            out.push(p.clone());
            walk(child, &p, out);
        }
    }
    let mut out = Vec::new();
    walk(doc, "", &mut out);
    out
}

fn apply(doc: &mut Value, at: usize, h: &Hostile) {
    let paths = nodes(doc);
    let Some(path) = paths.get(at % paths.len().max(1)) else { return };
    let (parent, key) = path.rsplit_once('/').unwrap();
    let new = match h {
        Hostile::Delete => {
            match doc.pointer_mut(parent) {
                Some(Value::Object(o)) => drop(o.remove(key)),
                Some(Value::Array(a)) => drop(a.remove(key.parse::<usize>().unwrap())),
                _ => {}
            }
            return;
        }
        Hostile::Value(v) => v.clone(),
        Hostile::Deep(_) => Value::Null, // written as text below: serde_json cannot build it
        Hostile::Long(n) => json!("ab ".repeat(n / 3)),
    };
    if let Some(node) = doc.pointer_mut(path) {
        *node = new;
    }
}

/// How the body is spoiled after the JSON mutations.
#[derive(Clone, Debug)]
enum BodyBytes {
    AsIs,
    /// Cut at this fraction (per mille) of the length.
    Cut(u16),
    /// A byte that is never UTF-8 (0xff) put at this fraction of the length.
    NotUtf8(u16),
    /// Padded past the server's limit.
    Oversized,
}

/// `Content-Length` sent.
#[derive(Clone, Debug)]
enum Length {
    Right,
    Missing,
    /// Shorter than the body by this many bytes.
    Short(usize),
    /// Larger than the limit.
    Huge(&'static str),
}

#[derive(Clone, Debug)]
struct HttpMutant {
    method: &'static str,
    path: &'static str,
    chat: bool,
    mutations: Vec<(usize, Hostile)>,
    bytes: BodyBytes,
    auth: Option<&'static str>,
    content_type: Option<&'static str>,
    length: Length,
    /// Ask for a stream (the `stream` field set before the mutations).
    stream: bool,
}

fn http_mutants() -> impl Strategy<Value = HttpMutant> {
    let method = prop_oneof![
        8 => Just("POST"),
        1 => prop::sample::select(vec!["GET", "PUT", "DELETE", "OPTIONS", "HEAD", "BREW"]),
    ];
    let path = prop_oneof![8 => Just(""), 1 => prop::sample::select(vec![
        "/health", "/v1/models", "/metrics", "/", "/v1/chat/completions/x", "/v1//completions",
        "/v1/completions?stream=true", "/%ff%fe", "/v1/../health",
    ])];
    let bytes = prop_oneof![
        6 => Just(BodyBytes::AsIs),
        1 => (0u16..1000).prop_map(BodyBytes::Cut),
        1 => (0u16..1000).prop_map(BodyBytes::NotUtf8),
        1 => Just(BodyBytes::Oversized),
    ];
    let auth = prop::sample::select(vec![
        Some("Bearer fuzz-key"),
        Some("Bearer fuzz-key"),
        Some("Bearer fuzz-key"),
        Some("Bearer fuzz-key"),
        Some("Bearer fuzz-key"),
        Some("Bearer fuzz-key"),
        Some("Bearer fuzz-key"),
        Some("Bearer fuzz-kez"),
        Some("Bearer "),
        Some("Basic Zm9vOmJhcg=="),
        None,
    ]);
    let content_type = prop::sample::select(vec![
        Some("application/json"),
        Some("application/json"),
        Some("text/plain"),
        Some("application/json; charset=latin1"),
        None,
    ]);
    let length = prop_oneof![
        6 => Just(Length::Right),
        1 => Just(Length::Missing),
        1 => (1usize..40).prop_map(Length::Short),
        1 => prop::sample::select(vec!["99999999999999999999999", "1048576"]).prop_map(Length::Huge),
    ];
    let mutations = prop::collection::vec((any::<usize>(), hostile()), 0..=3);
    (method, path, any::<bool>(), mutations, bytes, auth, content_type, length, any::<bool>()).prop_map(
        |(method, path, chat, mutations, bytes, auth, content_type, length, stream)| HttpMutant {
            method,
            path,
            chat,
            mutations,
            bytes,
            auth,
            content_type,
            length,
            stream,
        },
    )
}

/// The request `m` describes, as bytes.
fn request(m: &HttpMutant) -> Vec<u8> {
    let mut doc = match m.chat {
        true => {
            json!({"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who won?"}],
                       "max_tokens": 3, "temperature": 0.7, "top_p": 0.9, "seed": 5, "stop": ["\n"]})
        }
        false => {
            json!({"model": "m", "prompt": "The jury said", "max_tokens": 3, "temperature": 0, "stop": "x", "ignore_eos": true})
        }
    };
    if m.stream {
        doc["stream"] = json!(true);
        doc["stream_options"] = json!({"include_usage": true});
    }
    let mut deep = None;
    for (at, h) in &m.mutations {
        apply(&mut doc, *at, h);
        if let Hostile::Deep(n) = h {
            deep = Some(*n);
        }
    }
    let mut body = doc.to_string().into_bytes();
    if let Some(n) = deep {
        // The last `null` replaced by arrays nested n deep.
        if let Some(i) = body.windows(4).rposition(|w| w == b"null") {
            let nested = format!("{}{}", "[".repeat(n), "]".repeat(n));
            body.splice(i..i + 4, nested.into_bytes());
        }
    }
    match m.bytes {
        BodyBytes::AsIs => {}
        BodyBytes::Cut(p) => body.truncate(body.len() * p as usize / 1000),
        BodyBytes::NotUtf8(p) => {
            let at = body.len() * p as usize / 1000;
            body.insert(at, 0xff);
        }
        BodyBytes::Oversized => body.extend(std::iter::repeat_n(b' ', MAX_BODY)),
    }
    let path = match m.path {
        "" if m.chat => "/v1/chat/completions",
        "" => "/v1/completions",
        p => p,
    };
    let mut head = format!("{} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n", m.method);
    if let Some(a) = m.auth {
        head += &format!("Authorization: {a}\r\n");
    }
    if let Some(t) = m.content_type {
        head += &format!("Content-Type: {t}\r\n");
    }
    match &m.length {
        Length::Right => head += &format!("Content-Length: {}\r\n", body.len()),
        Length::Missing => {}
        Length::Short(k) => head += &format!("Content-Length: {}\r\n", body.len().saturating_sub(*k)),
        Length::Huge(n) => head += &format!("Content-Length: {n}\r\n"),
    }
    let mut out = (head + "\r\n").into_bytes();
    out.extend_from_slice(&body);
    out
}

/// Mutants per run: `ci`, 50 × `ci` with `MOESTREAM_FUZZ_LONG=1`, or `MOESTREAM_FUZZ_CASES`.
fn cases(ci: u32) -> u32 {
    if let Some(n) = std::env::var("MOESTREAM_FUZZ_CASES").ok().and_then(|v| v.parse().ok()) {
        return n;
    }
    match std::env::var("MOESTREAM_FUZZ_LONG").as_deref() {
        Ok("1") => ci * 50,
        _ => ci,
    }
}

fn runner(name: &str, ci: u32) -> TestRunner {
    let seed = name.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    TestRunner::new(Config {
        cases: cases(ci),
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 50,
        ..Config::default()
    })
}

/// One exchange checked: a well-formed answer that keeps the property, the server alive.
/// A HEAD answer has a status and headers only (its Content-Length is that of the GET answer).
fn exchange_checked(server: &Mutex<Server>, bytes: &[u8], framing_ok: bool) -> Result<u16, TestCaseError> {
    let head = bytes.starts_with(b"HEAD ");
    let mut s = server.lock().unwrap();
    let raw = s.exchange(bytes, framing_ok).map_err(TestCaseError::fail)?;
    s.check_alive().map_err(TestCaseError::fail)?;
    if raw.is_empty() && framing_ok {
        // hyper closes on a request it cannot parse.
        return Ok(0);
    }
    if head {
        return head_status(&raw).map_err(TestCaseError::fail);
    }
    let answer = parse_answer(&raw).map_err(|e| TestCaseError::fail(format!("malformed answer ({e}): {raw:?}")))?;
    if framing_ok && answer.status == 400 && answer.body.is_empty() {
        return Ok(400);
    }
    check_answer(&answer).map_err(TestCaseError::fail)?;
    Ok(answer.status)
}

/// The status of a HEAD answer: a 2xx or 4xx status line ending in a blank line.
fn head_status(raw: &[u8]) -> Result<u16, String> {
    let text = String::from_utf8_lossy(raw);
    let status: u16 = text.strip_prefix("HTTP/1.1 ").and_then(|s| s.get(..3)?.parse().ok()).ok_or("bad status line")?;
    match text.ends_with("\r\n\r\n") && (200..500).contains(&status) && !(300..400).contains(&status) {
        true => Ok(status),
        false => Err(format!("bad HEAD answer: {text}")),
    }
}

fn health_after(server: &Mutex<Server>) {
    let status = exchange_checked(server, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", false);
    assert_eq!(status.unwrap(), 200, "/health answers after the run");
}

#[test]
fn hostile_requests_to_serve() {
    let server = Mutex::new(Server::start());
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::new());
    let result = runner("serve/requests", 96).run(&http_mutants(), |m| {
        // A Content-Length beyond u64 is refused by hyper's framing, before any route runs.
        let framing = matches!(m.length, Length::Huge(n) if n.parse::<u64>().is_err());
        let status = exchange_checked(&server, &request(&m), framing)?;
        *statuses.borrow_mut().entry(status).or_insert(0usize) += 1;
        Ok(())
    });
    eprintln!("fuzz serve/requests: statuses {:?}", statuses.borrow());
    if let Err(e) = result {
        panic!("fuzz serve/requests: {e}");
    }
    health_after(&server);
}

#[test]
fn requests_that_are_not_http() {
    // Garbage request lines and headers: hyper's bare 400 or a closed connection is fine too.
    let server = Mutex::new(Server::start());
    let garbage = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..200),
        prop::collection::vec(any::<u8>(), 0..60).prop_map(|h| {
            let mut r = b"POST /v1/completions HTTP/1.1\r\nX-".to_vec();
            r.extend(h);
            r.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
            r
        }),
    ];
    let result = runner("serve/not-http", 24).run(&garbage, |bytes| exchange_checked(&server, &bytes, true).map(drop));
    if let Err(e) = result {
        panic!("fuzz serve/not-http: {e}");
    }
    health_after(&server);
}
