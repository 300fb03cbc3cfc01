//! The HTTP handlers: request checks, queueing on the engine, JSON and server-sent-event replies.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::api::{self, PromptInput};
use super::error::ApiError;
use super::structured::Structured;
use super::worker::{self, Event, Job, ModelInfo, NamedLogprob, Prompt, Worker};
use crate::chat::{Completion, CompletionRequest, FinishReason};
use crate::runtime::sampling_defaults::fresh_seed;
use crate::runtime::GenerateOptions;

/// What every handler shares.
pub struct AppState {
    /// The engine's queue and figures.
    pub worker: Worker,
    /// The served model.
    pub model: ModelInfo,
    /// Required bearer token, if any.
    pub api_key: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
}

type Shared = Arc<AppState>;

/// Tokens a completion generates when `max_tokens` is not given (OpenAI's default).
const DEFAULT_COMPLETION_TOKENS: usize = 16;

/// The routes, with OpenAI-style 404/405 answers.
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError::with_status(StatusCode::NOT_FOUND, "no such endpoint", "not_found") })
        .method_not_allowed_fallback(|| async {
            ApiError::with_status(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed on this endpoint",
                "method_not_allowed",
            )
        })
        .with_state(state)
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Prometheus text; behind the API key when the server has one (a scraper sends it as a bearer
/// token), since the counters tell what the server is asked.
async fn metrics(State(s): State<Shared>, headers: HeaderMap) -> Result<impl IntoResponse, ApiError> {
    authorize(&s, &headers)?;
    let text = s.worker.metrics.lock().expect("metrics lock").render();
    Ok(([("content-type", "text/plain; version=0.0.4")], text))
}

async fn models(State(s): State<Shared>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    authorize(&s, &headers)?;
    Ok(Json(json!({"object": "list", "data": [model_object(&s.model)]})))
}

async fn model(State(s): State<Shared>, Path(id): Path<String>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    authorize(&s, &headers)?;
    match id == s.model.id {
        true => Ok(Json(model_object(&s.model))),
        false => Err(ApiError::with_status(
            StatusCode::NOT_FOUND,
            format!("the model {id:?} does not exist (this server runs {:?})", s.model.id),
            "model_not_found",
        )),
    }
}

fn model_object(m: &ModelInfo) -> Value {
    json!({"id": m.id, "object": "model", "created": 0, "owned_by": "moestream", "context_length": m.context})
}

/// Checks `Authorization: Bearer KEY` when the server has a key.
fn authorize(s: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &s.api_key else { return Ok(()) };
    let given = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(g) if g == key => Ok(()),
        _ => Err(ApiError::with_status(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key (Authorization: Bearer KEY)",
            "invalid_api_key",
        )),
    }
}

/// The body, at most `max_body_bytes` of it: a larger `Content-Length` is a 413 before any of
/// the body is read, and so is a body (chunked) that turns out larger.
async fn body_bytes(s: &AppState, request: Request) -> Result<Bytes, ApiError> {
    let too_large = || {
        let message = format!("request body larger than {} bytes", s.max_body_bytes);
        ApiError::with_status(StatusCode::PAYLOAD_TOO_LARGE, message, "request_too_large")
    };
    let declared = request.headers().get("content-length").and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > s.max_body_bytes as u64) {
        return Err(too_large());
    }
    axum::body::to_bytes(request.into_body(), s.max_body_bytes).await.map_err(|e| {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(err) = source {
            if err.is::<http_body_util::LengthLimitError>() {
                return too_large();
            }
            source = err.source();
        }
        ApiError::invalid(format!("cannot read the request body: {e}"), None, "invalid_body")
    })
}

async fn chat_completions(State(s): State<Shared>, request: Request) -> Result<Response, ApiError> {
    authorize(&s, request.headers())?;
    let body = body_bytes(&s, request).await?;
    let req: api::ChatRequest = api::parse(&body)?;
    let options: api::Sampling = api::parse(&body)?;
    let structured: Structured = api::parse(&body)?;
    req.check()?;
    let (max_tokens, sampling, stop) = options.check(&s.model.sampling, fresh_seed(), false)?;
    let constraint = match (structured.constraint()?, req.forced_call()?) {
        (constraint, None) => constraint,
        (None, Some(name)) => {
            let format = s.model.tool_format.ok_or_else(|| {
                ApiError::invalid(
                    "`tool_choice` forcing a call: the model's chat template writes tool calls in no format moestream \
                     parses"
                        .to_string(),
                    Some("tool_choice"),
                    "unsupported_parameter",
                )
            })?;
            Some(format.forced_call(
                req.tools.as_deref().unwrap_or_default(),
                name.as_deref(),
                &s.model.tool_markers,
            )?)
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "`tool_choice` forcing a call and a structured `response_format` at once".to_string(),
                Some("tool_choice"),
                "invalid_value",
            ))
        }
    };
    let prompt = Prompt::Chat {
        tool_calls: req.parses_tool_calls(),
        messages: req.messages,
        tools: req.tools,
        variables: req.chat_template_kwargs.unwrap_or_default(),
    };
    let mut request = completion_request(max_tokens.unwrap_or(usize::MAX), sampling, stop, options.ignore_eos);
    request.options.logprobs = options.logprobs(true)?;
    request.options.constraint = constraint;
    respond(s, Kind::Chat, prompt, request, &options, false).await
}

async fn completions(State(s): State<Shared>, request: Request) -> Result<Response, ApiError> {
    authorize(&s, request.headers())?;
    let body = body_bytes(&s, request).await?;
    let req: api::CompletionRequest = api::parse(&body)?;
    let options: api::Sampling = api::parse(&body)?;
    let constraint = api::parse::<Structured>(&body)?.constraint()?;
    req.check(options.stream)?;
    let (max_tokens, sampling, stop) = options.check(&s.model.sampling, fresh_seed(), req.echo)?;
    let prompt = match req.prompt {
        PromptInput::Text(t) => Prompt::Text(t),
        PromptInput::Tokens(t) => Prompt::Tokens(t),
        PromptInput::Texts(mut t) => Prompt::Text(t.remove(0)),
        PromptInput::TokenLists(mut t) => Prompt::Tokens(t.remove(0)),
    };
    let mut request =
        completion_request(max_tokens.unwrap_or(DEFAULT_COMPLETION_TOKENS), sampling, stop, options.ignore_eos);
    request.options.logprobs = options.logprobs(false)?;
    // Echo with log-probabilities scores the prompt too (lm-evaluation-harness's loglikelihood).
    request.options.prompt_logprobs = req.echo && request.options.logprobs.is_some();
    request.options.constraint = constraint;
    respond(s, Kind::Text, prompt, request, &options, req.echo).await
}

fn completion_request(
    max_tokens: usize,
    sampling: crate::runtime::SamplingParams,
    stop: Vec<String>,
    ignore_eos: bool,
) -> CompletionRequest {
    CompletionRequest {
        options: GenerateOptions { max_tokens, sampling, ignore_eos, ..Default::default() },
        stop_tokens: Vec::new(),
        stop_strings: stop,
        tool_format: None,
        markers: Vec::new(),
        reasoning: None,
        harmony: false,
    }
}

/// A seed for requests that give none, so that their samples differ.
/// Sets the job's cancel flag when dropped: when the handler's future is dropped (the client
/// went away) or the stream's task ends.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Which API's object shapes to answer in.
#[derive(Clone, Copy)]
enum Kind {
    Chat,
    Text,
}

/// A choice's end: its completion and its tokens' log-probabilities.
type Answer = Box<worker::Answer>;

/// Fixed parts of every object of one reply.
struct Reply {
    kind: Kind,
    /// Whether log-probabilities were asked for.
    logprobs: bool,
    id: String,
    created: u64,
    model: String,
}

impl Reply {
    fn new(kind: Kind, model: &str, logprobs: bool) -> Reply {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let prefix = match kind {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        };
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Reply { kind, logprobs, id: format!("{prefix}-{created:x}{n:04x}"), created, model: model.to_string() }
    }

    fn object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Text, _) => "text_completion",
        }
    }

    fn envelope(&self, stream: bool, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(stream), "created": self.created, "model": self.model, "choices": choices})
    }

    /// A streamed piece of choice `index`: `text` (or the opening role delta) and, at the end,
    /// the finish reason.
    fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        finish: Option<FinishReason>,
        logprobs: &[NamedLogprob],
    ) -> Value {
        let lp = self.logprobs_object(logprobs);
        let finish = finish.map(finish_reason);
        let choice = match self.kind {
            Kind::Chat => {
                let delta = match text {
                    Some(t) => json!({"content": t}),
                    None if finish.is_none() => json!({"role": "assistant", "content": ""}),
                    None => json!({}),
                };
                json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish})
            }
            Kind::Text => json!({"index": index, "text": text.unwrap_or(""), "logprobs": lp, "finish_reason": finish}),
        };
        self.envelope(true, json!([choice]))
    }

    /// The completions API's `logprobs` of an echoed prompt (`prompt`: each token's text and,
    /// but the first's, log-probabilities) followed by the generated tokens'.
    fn echo_logprobs(&self, prompt: &[worker::PromptToken], generated: &[NamedLogprob]) -> Value {
        let prompt = prompt.iter().map(|(token, lp)| (token.as_str(), lp.as_ref()));
        completion_logprobs(prompt.chain(generated.iter().map(|lp| (lp.token.as_str(), Some(lp)))))
    }

    /// A choice's `logprobs` in this API's shape (null when not asked for).
    fn logprobs_object(&self, logprobs: &[NamedLogprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        match self.kind {
            Kind::Chat => {
                let entry =
                    |token: &str, logprob: f32| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
                let content: Vec<Value> = logprobs
                    .iter()
                    .map(|lp| {
                        let mut e = entry(&lp.token, lp.logprob);
                        e["top_logprobs"] = lp.top.iter().map(|(t, l)| entry(t, *l)).collect();
                        e
                    })
                    .collect();
                json!({"content": content})
            }
            Kind::Text => completion_logprobs(logprobs.iter().map(|lp| (lp.token.as_str(), Some(lp)))),
        }
    }

    /// The whole reply: every choice, in order.
    fn full(&self, answers: &[Answer]) -> Value {
        let choices: Vec<Value> = answers
            .iter()
            .enumerate()
            .map(|(index, a)| {
                let c = &a.completion;
                let finish = finish_reason(c.finish_reason);
                let logprobs = match &a.echo {
                    Some((_, prompt)) if self.logprobs => self.echo_logprobs(prompt, &a.logprobs),
                    _ => self.logprobs_object(&a.logprobs),
                };
                let text = match &a.echo {
                    Some((prompt, _)) => format!("{prompt}{}", c.text),
                    None => c.text.clone(),
                };
                match self.kind {
                    Kind::Chat => {
                        let mut message = json!({"role": "assistant", "content": text});
                        if !c.reasoning.is_empty() {
                            message["reasoning_content"] = json!(c.reasoning);
                        }
                        if !c.tool_calls.is_empty() {
                            if text.is_empty() {
                                message["content"] = Value::Null;
                            }
                            message["tool_calls"] = tool_calls_json(&c.tool_calls, false);
                        }
                        json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
                    }
                    Kind::Text => json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}),
                }
            })
            .collect();
        let mut v = self.envelope(false, Value::Array(choices));
        v["usage"] = usage(answers.iter().map(|a| &a.completion));
        v
    }
}

fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
        FinishReason::ToolCalls => "tool_calls",
    }
}

/// The completions API's `logprobs` of `tokens` (each with its log-probabilities, or none for
/// a prompt's first): parallel lists of the tokens, their log-probabilities, the alternatives'
/// and each token's offset in the text.
fn completion_logprobs<'t>(tokens: impl Iterator<Item = (&'t str, Option<&'t NamedLogprob>)>) -> Value {
    let (mut texts, mut lps, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut at = 0;
    for (token, lp) in tokens {
        texts.push(json!(token));
        lps.push(lp.map_or(Value::Null, |lp| json!(lp.logprob)));
        tops.push(lp.map_or(Value::Null, |lp| lp.top.iter().map(|(t, l)| (t.clone(), json!(l))).collect()));
        offsets.push(at);
        at += token.len();
    }
    json!({"tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// OpenAI's `tool_calls` of a message, or of a streamed delta (each with its `index`).
fn tool_calls_json(calls: &[crate::chat::ToolCall], streamed: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}});
            if streamed {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// Token counts of a reply: the prompt once, the choices' generated tokens together.
fn usage<'c>(choices: impl Iterator<Item = &'c Completion>) -> Value {
    let (mut p, mut g) = (0, 0);
    for c in choices {
        p = c.generation.prompt_tokens.len();
        g += c.generation.tokens.len();
    }
    json!({"prompt_tokens": p, "completion_tokens": g, "total_tokens": p + g})
}

/// Queues the job; answers with the whole reply, or streams it once the prompt was accepted (so
/// that a prompt over the context is still a 400, not an event in a 200 stream).
async fn respond(
    s: Shared,
    kind: Kind,
    prompt: Prompt,
    request: CompletionRequest,
    options: &api::Sampling,
    echo: bool,
) -> Result<Response, ApiError> {
    let (stream, include_usage) = (options.stream, options.include_usage());
    let n = options.n.unwrap_or(1) as usize;
    let request_logprobs = request.options.logprobs.is_some();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop(cancel.clone());
    s.worker.submit(Job { prompt, request, n, echo, events: events_tx, cancel });
    match events.recv().await {
        Some(Event::Started) => {}
        Some(Event::Done(_, Err(e))) => return Err(e.into()),
        _ => {
            return Err(ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, "the engine stopped", "server_error"))
        }
    }
    let reply = Reply::new(kind, &s.model.id, request_logprobs);
    if !stream {
        let mut done: Vec<Option<Answer>> = (0..n).map(|_| None).collect();
        loop {
            match events.recv().await {
                Some(Event::Text(..)) | Some(Event::Reasoning(..)) | Some(Event::Started) => {}
                Some(Event::Done(i, Ok(c))) => {
                    done[i] = Some(c);
                    if done.iter().all(Option::is_some) {
                        let choices: Vec<Answer> = done.into_iter().flatten().collect();
                        return Ok(Json(reply.full(&choices)).into_response());
                    }
                }
                Some(Event::Done(_, Err(e))) => return Err(e.into()),
                None => {
                    return Err(ApiError::with_status(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the engine stopped",
                        "server_error",
                    ))
                }
            }
        }
    }
    let (sse_tx, sse_rx) = mpsc::channel::<Result<SseEvent, Infallible>>(16);
    tokio::spawn(async move {
        // Dropping `events` or `guard` when the client is gone stops the generation.
        let _guard = guard;
        let send = |v: Value| sse_tx.send(Ok(SseEvent::default().data(v.to_string())));
        for index in 0..n {
            if matches!(kind, Kind::Chat) && send(reply.chunk(index, None, None, &[])).await.is_err() {
                return;
            }
        }
        // The choices that ended well, and how many ended at all.
        let (mut done, mut ended) = (Vec::new(), 0);
        while let Some(event) = events.recv().await {
            let sent = match event {
                Event::Started => Ok(()),
                Event::Text(i, t, logprobs) => send(reply.chunk(i, Some(&t), None, &logprobs)).await,
                Event::Reasoning(i, t) => {
                    let delta = json!({"reasoning_content": t});
                    let choice = json!([{"index": i, "delta": delta, "logprobs": null, "finish_reason": null}]);
                    send(reply.envelope(true, choice)).await
                }
                Event::Done(i, Ok(a)) => {
                    ended += 1;
                    let mut end = Ok(());
                    if !a.completion.tool_calls.is_empty() {
                        let delta = json!({"tool_calls": tool_calls_json(&a.completion.tool_calls, true)});
                        let calls = json!([{"index": i, "delta": delta, "logprobs": null, "finish_reason": null}]);
                        end = send(reply.envelope(true, calls)).await;
                    }
                    if end.is_ok() {
                        end = send(reply.chunk(i, None, Some(a.completion.finish_reason), &[])).await;
                    }
                    done.push(a);
                    if end.is_ok() && include_usage && ended == n {
                        let mut u = reply.envelope(true, json!([]));
                        u["usage"] = usage(done.iter().map(|a| &a.completion));
                        end = send(u).await;
                    }
                    end
                }
                Event::Done(_, Err(e)) => {
                    ended += 1;
                    send(json!({"error": {"message": e.to_string(), "type": "server_error"}})).await
                }
            };
            if sent.is_err() {
                return;
            }
            if ended == n {
                break;
            }
        }
        let _ = sse_tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Ok(Sse::new(ReceiverStream::new(sse_rx)).into_response())
}
