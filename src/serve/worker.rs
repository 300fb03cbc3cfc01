//! The engine's thread: requests queue first-come first-served (one engine, one reply at a
//! time) and stream their text back; a request whose client has gone is skipped or stopped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use serde_json::{Map, Value};
use tokio::sync::{mpsc as async_mpsc, oneshot};

use super::metrics::Metrics;
use crate::chat::{
    complete, end_of_turn_tokens, ChatMessage, ChatTemplate, Completion, CompletionRequest, FinishReason, RenderOptions,
};
use crate::error::{Error, Result};
use crate::runtime::{Engine, EngineOptions, Session};

/// What to prompt the model with.
pub enum Prompt {
    /// Raw text (tokenized with the tokenizer's special tokens).
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A conversation, rendered with the model's chat template and a generation prompt.
    Chat {
        /// The messages.
        messages: Vec<ChatMessage>,
        /// Tool schemas.
        tools: Option<Vec<Value>>,
        /// Extra template variables.
        variables: Map<String, Value>,
    },
}

/// A queued request.
pub struct Job {
    /// The prompt.
    pub prompt: Prompt,
    /// Token limit (capped to the room left in the context), sampling, stop strings; chat
    /// prompts also stop at the template's end-of-turn tokens.
    pub request: CompletionRequest,
    /// Where the reply goes.
    pub events: async_mpsc::UnboundedSender<Event>,
    /// Set when the client has gone.
    pub cancel: Arc<AtomicBool>,
}

/// What a job reports, in order: `Started`, any number of `Text`, then `Done`; or only `Done`
/// with an error.
pub enum Event {
    /// The prompt was accepted and generation begins.
    Started,
    /// A piece of the reply.
    Text(String),
    /// The end (the completion boxed: it is large and sent once).
    Done(Result<Box<Completion>>),
}

/// What the HTTP side needs to know about the loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The id `/v1/models` lists (the model directory's name).
    pub id: String,
    /// Context length in tokens.
    pub context: usize,
}

/// The queue into the engine's thread. Dropping it closes the queue and waits for the thread,
/// which finishes the reply in progress and drops the engine: its memory is back when the drop
/// returns.
pub struct Worker {
    /// `None` once dropped (the engine's loop ends when the queue closes).
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Shared figures.
    pub metrics: Arc<Mutex<Metrics>>,
}

impl Worker {
    /// Loads the engine on its own thread and starts serving the queue; returns when the model is
    /// loaded (or failed to).
    pub fn start(options: EngineOptions, chat_template: Option<std::path::PathBuf>) -> Result<(Worker, ModelInfo)> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let metrics = Arc::new(Mutex::new(Metrics::default()));
        let shared = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("moestream-engine".into())
            .spawn(move || {
                let loaded = Engine::load(&options).and_then(|engine| {
                    let template = ChatTemplate::with_override(engine.model_dir(), chat_template.as_deref())?;
                    let session = engine.new_session()?;
                    Ok((engine, template, session))
                });
                let (engine, template, session) = match loaded {
                    Ok(v) => v,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let id = options.model_dir.file_name().map_or("model".into(), |n| n.to_string_lossy().into_owned());
                let _ = ready_tx.send(Ok(ModelInfo { id, context: engine.context() }));
                let end_of_turn = end_of_turn_tokens(&engine, template.as_ref());
                let mut server = EngineLoop { engine, session, template, end_of_turn, metrics: shared };
                for job in queue {
                    server.run(job);
                }
            })
            .map_err(|e| Error::InvalidArgument(format!("cannot start the engine thread: {e}")))?;
        let info = ready_rx.blocking_recv().map_err(|_| Error::InvalidArgument("the engine thread died".into()))??;
        Ok((Worker { jobs: Mutex::new(Some(jobs)), thread: Some(thread), metrics }, info))
    }

    /// Queues a job behind those already waiting.
    pub fn submit(&self, job: Job) {
        self.metrics.lock().expect("metrics lock").queued += 1;
        let jobs = self.jobs.lock().expect("queue lock");
        let refused = match jobs.as_ref() {
            Some(queue) => queue.send(job).err().map(|mpsc::SendError(job)| job),
            None => Some(job),
        };
        drop(jobs);
        if let Some(job) = refused {
            self.metrics.lock().expect("metrics lock").queued -= 1;
            let _ = job.events.send(Event::Done(Err(Error::InvalidArgument("the engine has stopped".into()))));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.jobs.lock().expect("queue lock").take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                log::error!("the engine thread panicked");
            }
        }
    }
}

/// The engine's side of the queue. Its one session keeps the last request's tokens and KV cache:
/// a request that extends it (the next turn of the same conversation, or any shared prefix)
/// prefills only the rest.
struct EngineLoop {
    engine: Engine,
    session: Session,
    template: Option<ChatTemplate>,
    end_of_turn: Vec<u32>,
    metrics: Arc<Mutex<Metrics>>,
}

impl EngineLoop {
    fn run(&mut self, mut job: Job) {
        self.metrics.lock().expect("metrics lock").queued -= 1;
        if job.cancel.load(Ordering::Relaxed) || job.events.is_closed() {
            self.metrics.lock().expect("metrics lock").cancelled += 1;
            return;
        }
        let result = self.prompt_tokens(&job.prompt).and_then(|prompt| {
            let _ = job.events.send(Event::Started);
            let room = self.engine.context() - prompt.len();
            job.request.options.max_tokens = job.request.options.max_tokens.min(room);
            if matches!(job.prompt, Prompt::Chat { .. }) && !job.request.options.ignore_eos {
                job.request.stop_tokens = self.end_of_turn.clone();
            }
            complete(&self.engine, &mut self.session, &prompt, &job.request, |piece| {
                !job.cancel.load(Ordering::Relaxed) && job.events.send(Event::Text(piece.to_string())).is_ok()
            })
        });
        // The request's number in the access log: requests answered or failed so far.
        let number = {
            let mut m = self.metrics.lock().expect("metrics lock");
            match &result {
                Ok(c) => {
                    m.requests += 1;
                    m.cancelled += (c.finish_reason == FinishReason::Cancelled) as u64;
                    m.prompt_tokens += c.generation.prompt_tokens.len() as u64;
                    m.reused_tokens += c.generation.stats.reused_tokens as u64;
                    m.generated_tokens += c.generation.tokens.len() as u64;
                    m.last_prefill_tokens_per_s = c.generation.stats.prefill_tokens_per_s;
                    m.last_decode_tokens_per_s = c.generation.stats.decode_tokens_per_s;
                }
                Err(_) => m.failed += 1,
            }
            m.experts = self.engine.expert_stats();
            m.requests + m.failed
        };
        match &result {
            Ok(c) => {
                let (g, s) = (&c.generation, &c.generation.stats);
                log::info!(
                    "request {}: {} prompt tokens ({} reused, {} prefilled at {:.1} tok/s), {} generated at {:.1} tok/s, {:?}",
                    number,
                    g.prompt_tokens.len(),
                    s.reused_tokens,
                    s.prefilled_tokens,
                    s.prefill_tokens_per_s,
                    g.tokens.len(),
                    s.decode_tokens_per_s,
                    c.finish_reason
                )
            }
            Err(e) => log::info!("request {number}: failed: {e}"),
        }
        let _ = job.events.send(Event::Done(result.map(Box::new)));
    }

    /// The prompt's tokens, checked to leave room for at least one generated token.
    fn prompt_tokens(&self, prompt: &Prompt) -> Result<Vec<u32>> {
        let tokens = match prompt {
            Prompt::Tokens(t) => t.clone(),
            Prompt::Text(text) => self.engine.encode(text)?,
            Prompt::Chat { messages, tools, variables } => {
                let template = self
                    .template
                    .as_ref()
                    .ok_or_else(|| Error::NoChatTemplate(self.engine.model_dir().to_path_buf()))?;
                let options =
                    RenderOptions { add_generation_prompt: true, tools: tools.clone(), variables: variables.clone() };
                self.engine.encode_raw(&template.render(messages, &options)?)?
            }
        };
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if tokens.len() >= self.engine.context() {
            return Err(Error::ContextOverflow { requested: tokens.len() + 1, context: self.engine.context() });
        }
        Ok(tokens)
    }
}
