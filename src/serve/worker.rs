//! The engine's thread: requests queue first-come first-served and run together through the
//! runtime's [`Scheduler`] (up to `--parallel` at once, each step carrying all of them), their
//! text streamed back; a request whose client has gone is dropped from the queue or stopped.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use serde_json::{Map, Value};
use tokio::sync::{mpsc as async_mpsc, oneshot};

use super::metrics::Metrics;
use super::ServeOptions;
use crate::chat::{
    end_of_turn_tokens, is_harmony, thinking_start, ChatMessage, ChatTemplate, Completion, CompletionRequest,
    FinishReason, Part, RenderOptions, Reply, ToolFormat,
};
use crate::error::{Error, Result};
use crate::runtime::drafts::PromptLookup;
use crate::runtime::logprobs::TokenLogprob;
use crate::runtime::{Engine, EngineOptions, Finished, RequestId, SamplingParams, Scheduler};

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
        /// Parse tool calls out of the reply (in the template's format).
        tool_calls: bool,
    },
}

/// A queued request.
pub struct Job {
    /// The prompt.
    pub prompt: Prompt,
    /// Token limit (capped to the room left in the context), sampling, stop strings; chat
    /// prompts also stop at the template's end-of-turn tokens.
    pub request: CompletionRequest,
    /// Choices of the reply (the prompt prefilled once, each choice sampled with the seed plus
    /// its index).
    pub n: usize,
    /// Give the prompt back before the reply (with its tokens' log-probabilities when the
    /// request asks for log-probabilities).
    pub echo: bool,
    /// Where the reply goes.
    pub events: async_mpsc::UnboundedSender<Event>,
    /// Set when the client has gone.
    pub cancel: Arc<AtomicBool>,
}

/// What a job reports, in order: `Started`, then for each choice (its index first) any number
/// of `Text` and one `Done`, the choices' events interleaved; or only one `Done` with an error.
pub enum Event {
    /// The prompt was accepted and generation begins.
    Started,
    /// A piece of a choice's reply, with the log-probabilities (when asked for) of the tokens
    /// taken since the last piece.
    Text(usize, String, Vec<NamedLogprob>),
    /// A piece of a choice's reasoning (`reasoning_content`).
    Reasoning(usize, String),
    /// A choice's end (the completion boxed: it is large and sent once), with every generated
    /// token's log-probabilities when asked for.
    Done(usize, Result<Box<Answer>>),
}

/// A choice's end.
pub struct Answer {
    /// The reply.
    pub completion: Completion,
    /// Its generated tokens' log-probabilities (when asked for).
    pub logprobs: Vec<NamedLogprob>,
    /// The prompt, when the job asked for it back (`echo`): its text and, when log-probabilities
    /// were asked for, each of its tokens (the first without a log-probability).
    pub echo: Option<(String, Vec<PromptToken>)>,
}

/// An echoed prompt token: its text and (but the first's) log-probabilities.
pub type PromptToken = (String, Option<NamedLogprob>);

/// A generated token's log-probability and the most likely alternatives', each token as text.
#[derive(Clone, Debug)]
pub struct NamedLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens' texts and log-probabilities, most likely first.
    pub top: Vec<(String, f32)>,
}

/// What the HTTP side needs to know about the loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The id `/v1/models` lists (the model directory's name).
    pub id: String,
    /// Context length in tokens.
    pub context: usize,
    /// Requests answered at once.
    pub parallel: usize,
    /// What a request's absent sampling fields take ([`Engine::sampling_defaults`]).
    pub sampling: SamplingParams,
    /// How the chat template writes tool calls (what a forced call follows), if it writes any
    /// moestream parses.
    pub tool_format: Option<ToolFormat>,
    /// That format's marker tokens in the model's vocabulary, which a forced call's grammar
    /// names by id ([`ToolFormat::marker_tokens`]).
    pub tool_markers: Vec<(u32, String)>,
}

/// Requests answered at once unless `--parallel` says otherwise (llama-server's default too).
pub const DEFAULT_PARALLEL: usize = 4;

/// Loads the engine for `parallel` sequences, or by default for [`DEFAULT_PARALLEL`], halving
/// them while their caches do not fit.
fn load_for(options: &mut EngineOptions, parallel: Option<usize>) -> Result<Engine> {
    let mut sequences = parallel.unwrap_or(DEFAULT_PARALLEL).max(1);
    loop {
        options.parallel = sequences;
        match Engine::load(options) {
            Err(Error::KvCacheTooLarge { what, .. }) if parallel.is_none() && sequences > 1 => {
                log::warn!("{what} does not fit: {} requests at once", sequences / 2);
                sequences /= 2;
            }
            loaded => return loaded,
        }
    }
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
    /// Loads the engine on its own thread and starts serving the queue as `serve` says:
    /// `parallel` requests at once (`None`: [`DEFAULT_PARALLEL`] where the memory allows, fewer
    /// where it does not), its chat template, reasoning split and drafts; returns when the
    /// model is loaded (or failed to).
    pub fn start(options: EngineOptions, serve: &ServeOptions) -> Result<(Worker, ModelInfo)> {
        let ServeOptions { parallel, chat_template, split_reasoning, drafts, mtp_drafts, .. } = serve.clone();
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = oneshot::channel();
        let metrics = Arc::new(Mutex::new(Metrics::default()));
        let shared = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("moestream-engine".into())
            .spawn(move || {
                let mut options = options;
                let engine = match load_for(&mut options, parallel) {
                    Ok(engine) => engine,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let started = ChatTemplate::with_override(engine.model_dir(), chat_template.as_deref())
                    .and_then(|template| Ok((template, Scheduler::new(&engine, options.parallel.max(1))?)));
                let (template, scheduler) = match started {
                    Ok(v) => v,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let id = options.model_dir.file_name().map_or("model".into(), |n| n.to_string_lossy().into_owned());
                let tool_format = template.as_ref().and_then(|t| ToolFormat::of_template(t.source()));
                let tool_markers = match (tool_format, engine.tokenizer()) {
                    (Some(format), Some(tokenizer)) => format.marker_tokens(tokenizer),
                    _ => Vec::new(),
                };
                let info = ModelInfo {
                    id,
                    context: engine.context(),
                    parallel: options.parallel.max(1),
                    sampling: engine.sampling_defaults(),
                    tool_format,
                    tool_markers,
                };
                let _ = ready_tx.send(Ok(info));
                let end_of_turn = end_of_turn_tokens(&engine, template.as_ref());
                let mut server = EngineLoop {
                    engine: &engine,
                    scheduler,
                    template,
                    split_reasoning,
                    drafts,
                    mtp_drafts: if engine.model().has_mtp() { mtp_drafts } else { 0 },
                    end_of_turn,
                    metrics: shared,
                    replies: HashMap::new(),
                };
                server.serve(&queue);
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
            let _ = job.events.send(Event::Done(0, Err(Error::InvalidArgument("the engine has stopped".into()))));
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

/// The engine's side of the queue: the scheduler's slots keep their sequences after a reply, so
/// a request that extends one (the next turn of a conversation, or any shared prefix) prefills
/// only the rest.
struct EngineLoop<'a> {
    engine: &'a Engine,
    scheduler: Scheduler<'a>,
    template: Option<ChatTemplate>,
    /// Keep `<think>` reasoning apart (`reasoning_content`) where the template thinks in tags.
    split_reasoning: bool,
    /// Prompt-lookup drafts for the requests without a constraint.
    drafts: Option<PromptLookup>,
    /// MTP drafts a step for the requests without a constraint (0: none, or no module), in
    /// place of `drafts`.
    mtp_drafts: usize,
    end_of_turn: Vec<u32>,
    metrics: Arc<Mutex<Metrics>>,
    replies: HashMap<RequestId, Running>,
}

/// Token `id` as text (empty without a tokenizer).
fn token_text(engine: &Engine, id: u32) -> String {
    engine.tokenizer().and_then(|t| t.decode(&[id]).ok()).unwrap_or_default()
}

/// `lp` with its tokens as text.
fn named(engine: &Engine, lp: &TokenLogprob) -> NamedLogprob {
    let text = |id| token_text(engine, id);
    NamedLogprob { token: text(lp.id), logprob: lp.logprob, top: lp.top.iter().map(|&(id, l)| (text(id), l)).collect() }
}

/// A choice the scheduler runs: its job's request and channels, its index and its reply so far
/// (shared with the token callback).
struct Running {
    request: CompletionRequest,
    events: async_mpsc::UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    index: usize,
    reply: Rc<RefCell<Option<Reply>>>,
    /// The prompt's text, to give back (`echo`).
    echo: Option<String>,
}

impl<'a> EngineLoop<'a> {
    /// Takes jobs from `queue` and runs steps until the queue closes and every reply is done.
    fn serve(&mut self, queue: &mpsc::Receiver<Job>) {
        let mut open = true;
        loop {
            if self.scheduler.is_idle() {
                if !open {
                    return;
                }
                // Nothing to run: wait for a job.
                match queue.recv() {
                    Ok(job) => self.accept(job),
                    Err(_) => return,
                }
            }
            loop {
                match queue.try_recv() {
                    Ok(job) => self.accept(job),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            for (&id, r) in &self.replies {
                if r.cancel.load(Ordering::Relaxed) || r.events.is_closed() {
                    self.scheduler.cancel(id);
                }
            }
            let stepped = self.scheduler.step();
            {
                let mut m = self.metrics.lock().expect("metrics lock");
                (m.steps, m.step_sequences) = self.scheduler.step_counts();
            }
            match stepped {
                Ok(finished) => finished.into_iter().for_each(|f| self.finish(f)),
                Err(e) => {
                    // Admission failed (the expert trace could not be written): every reply ends.
                    let text = e.to_string();
                    for (_, r) in self.replies.drain() {
                        let _ = r.events.send(Event::Done(r.index, Err(Error::BatchStepFailed(text.clone()))));
                    }
                    self.scheduler = match Scheduler::new(self.engine, 1) {
                        Ok(s) => s,
                        Err(_) => return,
                    };
                }
            }
        }
    }

    /// Tokenizes and checks `job`'s prompt and queues it on the scheduler, or answers it with
    /// the error.
    fn accept(&mut self, mut job: Job) {
        self.metrics.lock().expect("metrics lock").queued -= 1;
        if job.cancel.load(Ordering::Relaxed) || job.events.is_closed() {
            self.metrics.lock().expect("metrics lock").cancelled += 1;
            return;
        }
        let (prompt, rendered) = match self.prompt_tokens(&job.prompt) {
            Ok(p) => p,
            Err(e) => {
                self.count(None);
                log::info!("request refused: {e}");
                let _ = job.events.send(Event::Done(0, Err(e)));
                return;
            }
        };
        let echo_text = job.echo.then(|| match &job.prompt {
            Prompt::Text(text) => text.clone(),
            _ => self.engine.tokenizer().and_then(|t| t.decode(&prompt).ok()).unwrap_or_default(),
        });
        let room = self.engine.context() - prompt.len();
        job.request.options.max_tokens = job.request.options.max_tokens.min(room);
        if matches!(job.prompt, Prompt::Chat { .. }) && !job.request.options.ignore_eos {
            job.request.stop_tokens = self.end_of_turn.clone();
        }
        if let Prompt::Chat { tool_calls: true, .. } = job.prompt {
            job.request.tool_format = self.template.as_ref().and_then(|t| ToolFormat::of_template(t.source()));
        }
        let mut harmony = false;
        if let (true, Some(t), Some(rendered)) = (self.split_reasoning, &self.template, &rendered) {
            job.request.reasoning = thinking_start(t.source(), rendered);
            // gpt-oss: channels split the reply (reasoning, answer, calls).
            harmony = is_harmony(t.source());
        }
        if let Some(tokenizer) = self.engine.tokenizer() {
            job.request.constrain_after_reasoning(tokenizer);
            job.request.read_markers(tokenizer, harmony);
        }
        let replies: Vec<_> = (0..job.n).map(|_| Rc::new(RefCell::new(Some(Reply::new(&job.request))))).collect();
        let engine = self.engine;
        let on_token = |index: usize| -> crate::runtime::OnToken<'a> {
            let (shared, events, cancel) = (replies[index].clone(), job.events.clone(), job.cancel.clone());
            // Log-probabilities of tokens whose text has not been sent yet.
            let mut pending = Vec::new();
            Box::new(move |id: u32, piece: &str, logprob: Option<&TokenLogprob>| {
                pending.extend(logprob.map(|lp| named(engine, lp)));
                let mut reply = shared.borrow_mut();
                let reply = reply.as_mut().expect("the reply lives until its request ends");
                reply.token_parts(id, piece, |part, text| {
                    let event = match part {
                        Part::Reasoning => Event::Reasoning(index, text.to_string()),
                        Part::Content => Event::Text(index, text.to_string(), std::mem::take(&mut pending)),
                    };
                    !cancel.load(Ordering::Relaxed) && events.send(event).is_ok()
                })
            })
        };
        let mut options = job.request.generate_options();
        if options.constraint.is_none() {
            match self.mtp_drafts {
                0 => options.drafts = self.drafts,
                n => options.mtp_drafts = n,
            }
        }
        match self.scheduler.submit_n(prompt, options, job.n, on_token) {
            Ok(ids) => {
                let _ = job.events.send(Event::Started);
                for (index, (id, reply)) in ids.into_iter().zip(replies).enumerate() {
                    let mut request = job.request.clone();
                    request.options.sampling.seed = request.options.sampling.seed.wrapping_add(index as u64);
                    let (events, cancel) = (job.events.clone(), job.cancel.clone());
                    let echo = echo_text.clone();
                    self.replies.insert(id, Running { request, events, cancel, index, reply, echo });
                }
            }
            Err(e) => {
                self.count(None);
                let _ = job.events.send(Event::Done(0, Err(e)));
            }
        }
    }

    /// Answers the request that `f` ended.
    fn finish(&mut self, f: Finished) {
        let Some(Running { request, events, cancel, index, reply, echo }) = self.replies.remove(&f.id) else { return };
        let reply = reply.borrow_mut().take().expect("a reply ends once");
        let result = f.result.map(|generation| {
            reply.finish_parts(generation, &request, self.engine.context(), |part, text| {
                let event = match part {
                    Part::Reasoning => Event::Reasoning(index, text.to_string()),
                    Part::Content => Event::Text(index, text.to_string(), Vec::new()),
                };
                events.send(event).is_ok()
            })
        });
        // A reply whose client went away is counted as cancelled.
        let result = result.map(|mut c| {
            if cancel.load(Ordering::Relaxed) || events.is_closed() {
                c.finish_reason = FinishReason::Cancelled;
            }
            c
        });
        let number = self.count(Some(&result));
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
        let engine = self.engine;
        let answer = result.map(|completion| {
            let logprobs = completion.generation.logprobs.iter().map(|lp| named(engine, lp)).collect();
            let echo = echo.map(|text| {
                let g = &completion.generation;
                let prompt_lps =
                    std::iter::once(None).chain(g.prompt_logprobs.iter().map(|lp| Some(named(engine, lp))));
                let tokens = g.prompt_tokens.iter().zip(prompt_lps).map(|(&id, lp)| (token_text(engine, id), lp));
                // Every prompt token, the first (no log-probability) too, when they were asked for.
                (text, if request.options.prompt_logprobs { tokens.collect() } else { Vec::new() })
            });
            Box::new(Answer { completion, logprobs, echo })
        });
        let _ = events.send(Event::Done(index, answer));
    }

    /// Counts a request's outcome (`None`: refused before it ran) and returns its number in
    /// the access log: requests answered or failed so far.
    fn count(&self, result: Option<&Result<Completion>>) -> u64 {
        let mut m = self.metrics.lock().expect("metrics lock");
        match result {
            Some(Ok(c)) => {
                m.requests += 1;
                m.cancelled += (c.finish_reason == FinishReason::Cancelled) as u64;
                m.prompt_tokens += c.generation.prompt_tokens.len() as u64;
                m.reused_tokens += c.generation.stats.reused_tokens as u64;
                m.generated_tokens += c.generation.tokens.len() as u64;
                m.draft_tokens += c.generation.stats.draft_tokens as u64;
                m.accepted_draft_tokens += c.generation.stats.accepted_draft_tokens as u64;
                m.last_prefill_tokens_per_s = c.generation.stats.prefill_tokens_per_s;
                m.last_decode_tokens_per_s = c.generation.stats.decode_tokens_per_s;
            }
            Some(Err(_)) | None => m.failed += 1,
        }
        m.experts = self.engine.expert_stats();
        m.requests + m.failed
    }
    /// The prompt's tokens, checked to leave room for at least one generated token.
    fn prompt_tokens(&self, prompt: &Prompt) -> Result<(Vec<u32>, Option<String>)> {
        let mut rendered = None;
        let tokens = match prompt {
            Prompt::Tokens(t) => t.clone(),
            Prompt::Text(text) => self.engine.encode(text)?,
            Prompt::Chat { messages, tools, variables, .. } => {
                let template = self
                    .template
                    .as_ref()
                    .ok_or_else(|| Error::NoChatTemplate(self.engine.model_dir().to_path_buf()))?;
                let options =
                    RenderOptions { add_generation_prompt: true, tools: tools.clone(), variables: variables.clone() };
                let text = template.render(messages, &options)?;
                self.engine.encode_raw(rendered.insert(text))?
            }
        };
        if tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if tokens.len() >= self.engine.context() {
            return Err(Error::ContextOverflow { requested: tokens.len() + 1, context: self.engine.context() });
        }
        Ok((tokens, rendered))
    }
}
