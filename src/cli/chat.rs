//! `moestream chat`: a terminal conversation through the model's chat template.
//!
//! Turns are typed at a line editor (history saved per model; a trailing `\` or a `"""` block
//! for several lines) or piped; `/reset`, `/system TEXT`, `/save FILE`, `/load FILE`, `/help`
//! and `/quit` are commands. Replies stream as they are generated and end at the template's
//! end-of-turn tokens; the session's KV cache keeps the conversation, so each turn prefills only
//! what is new; Ctrl-C stops the reply (at the prompt it clears the line; Ctrl-D exits).

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;

use super::chat_input::ChatInput;
use super::model_args::{DraftArgs, ModelArgs, SamplingArgs};
use moestream::chat::{
    complete, end_of_turn_tokens, is_harmony, ChatMessage, ChatTemplate, CompletionRequest, RenderOptions, Role,
    ToolCall, ToolChoice,
};
use moestream::runtime::{GenerateOptions, Session};
use moestream::{Engine, Error, Result};
use serde_json::{json, Value};

/// Flags of `chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A system message opening the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply.
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    /// Sampling flags; the seed, given or fresh, advances by one each reply.
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    drafts: DraftArgs,
    /// Do not stop at end-of-turn tokens (replies run to --max-tokens; for measurements).
    #[arg(long)]
    ignore_eos: bool,
    /// A Jinja chat template to use instead of the model's (needed for a model without one).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<std::path::PathBuf>,
    /// Tools the model may call: a JSON file of OpenAI tool objects (a list, or `{"tools":
    /// [...]}`), given to the template; calls are shown and kept, `/tool RESULT` answers one.
    #[arg(long, value_name = "FILE")]
    tools: Option<std::path::PathBuf>,
    /// With --tools: `auto` (the model decides), `none` (replies stay text), `required` (every
    /// reply is a call, by constrained decoding) or a function's name (a call to it).
    #[arg(long, value_name = "CHOICE", default_value = "auto", requires = "tools")]
    tool_choice: String,
}

/// The conversation so far and how to extend it. The session keeps the KV cache of the turns so
/// far, so each reply prefills only the new turn.
struct Conversation<'a> {
    engine: &'a Engine,
    session: Session,
    template: ChatTemplate,
    system: Option<String>,
    messages: Vec<ChatMessage>,
    request: CompletionRequest,
    /// Tool schemas given to the template (`--tools`).
    tools: Option<Vec<Value>>,
}

/// Runs `chat` until end of input or `/quit`.
pub fn run(a: ChatArgs) -> Result<()> {
    a.sampling.validate()?;
    let engine = a.model.load_with(a.drafts.mtp_load())?;
    let drafts = a.drafts.plan(&engine, false)?;
    let template = ChatTemplate::with_override(engine.model_dir(), a.chat_template.as_deref())?
        .ok_or_else(|| Error::NoChatTemplate(a.model.dir()))?;
    if engine.tokenizer().is_none() {
        return Err(Error::Tokenizer("the model has no tokenizer.json".into()));
    }
    let stop_tokens = match a.ignore_eos {
        true => Vec::new(),
        false => end_of_turn_tokens(&engine, Some(&template)),
    };
    let request = CompletionRequest {
        options: GenerateOptions {
            max_tokens: a.max_tokens,
            sampling: a.sampling.sampling(&engine),
            ignore_eos: a.ignore_eos,
            drafts: drafts.lookup,
            mtp_drafts: drafts.mtp,
            ..Default::default()
        },
        stop_tokens,
        stop_strings: Vec::new(),
        tool_format: None,
        markers: Vec::new(),
        reasoning: None,
        harmony: false,
    };
    let mut request = request;
    let tools = a.tools.as_deref().map(read_tools).transpose()?;
    if let Some(tools) = &tools {
        let choice = ToolChoice::from_flag(&a.tool_choice)?;
        let tokenizer = engine.tokenizer().expect("checked above");
        request.use_tools(template.source(), tools, &choice, tokenizer).map_err(|e| match e {
            Error::InvalidArgument(why) => Error::InvalidArgument(format!("--tool-choice: {why}")),
            e => e,
        })?;
    }
    if request.options.constraint.is_some() && (request.options.mtp_drafts > 0 || request.options.drafts.is_some()) {
        // A forced call's grammar and drafts do not run together: the call goes without them.
        log::info!("drafts are off: the forced tool call runs under a grammar");
        (request.options.mtp_drafts, request.options.drafts) = (0, None);
    }
    // gpt-oss: only the final channel is shown (its analysis is reasoning, its calls calls).
    request.read_markers(engine.tokenizer().expect("checked above"), is_harmony(template.source()));
    let session = engine.new_session()?;
    let mut chat =
        Conversation { engine: &engine, session, template, system: a.system, messages: Vec::new(), request, tools };
    chat.reset();

    let stop = Arc::new(AtomicBool::new(false));
    let generating = Arc::new(AtomicBool::new(false));
    {
        let (stop, generating) = (stop.clone(), generating.clone());
        ctrlc::set_handler(move || {
            if generating.load(Ordering::SeqCst) {
                stop.store(true, Ordering::SeqCst);
            } else {
                eprintln!();
                std::process::exit(130);
            }
        })
        .map_err(|e| Error::InvalidArgument(format!("cannot install the Ctrl-C handler: {e}")))?;
    }

    let history = moestream::convert::default_cache_root().join("chat-history").join(format!(
        "{}.txt",
        moestream::convert::model_key(&std::fs::canonicalize(engine.model_dir()).unwrap_or(a.model.dir()), &[])
    ));
    let mut input = ChatInput::open(Some(history));
    if input.interactive() {
        eprintln!(
            "Chatting with {} — /help for commands, Ctrl-C stops a reply, Ctrl-D exits; end a line with \\ \
             or open a \"\"\" block for several lines.",
            engine.model_dir().display()
        );
    }
    while let Some(text) = input.next_turn()? {
        if text.trim().is_empty() {
            continue;
        }
        // The message a turn sends: the person's text, or a tool's result.
        let message = match command(&text) {
            Some(("/quit" | "/exit", _)) => break,
            Some(("/reset", _)) => {
                chat.reset();
                eprintln!("[conversation cleared]");
                continue;
            }
            Some(("/system", text)) => {
                chat.system = (!text.is_empty()).then(|| text.to_string());
                chat.reset();
                eprintln!("[system message set; conversation cleared]");
                continue;
            }
            Some(("/save", file)) if !file.is_empty() => {
                match chat.save(Path::new(file)) {
                    Ok(()) => eprintln!("[saved {} messages to {file}]", chat.messages.len()),
                    Err(e) => eprintln!("error: {e}"),
                }
                continue;
            }
            Some(("/load", file)) if !file.is_empty() => {
                match chat.load(Path::new(file)) {
                    Ok(()) => eprintln!("[loaded {} messages from {file}]", chat.messages.len()),
                    Err(e) => eprintln!("error: {e}"),
                }
                continue;
            }
            Some(("/tool", result)) if !result.is_empty() => {
                let Some(id) = chat.last_call_id() else {
                    eprintln!("error: /tool answers a tool call, and the last reply made none");
                    continue;
                };
                let mut message = ChatMessage::new(Role::Tool, result);
                message.extra.insert("tool_call_id".into(), Value::from(id));
                message
            }
            Some(("/help", _)) => {
                eprintln!("{HELP}");
                continue;
            }
            Some((unknown, _)) => {
                eprintln!("error: unknown command {unknown}; {HELP}");
                continue;
            }
            None => ChatMessage::new(Role::User, text.as_str()),
        };
        stop.store(false, Ordering::SeqCst);
        generating.store(true, Ordering::SeqCst);
        let result = chat.turn(message, &stop);
        generating.store(false, Ordering::SeqCst);
        if let Err(e) = result {
            eprintln!("error: {e}");
        }
    }
    Ok(())
}

/// What `/help` prints.
const HELP: &str = "commands: /reset (forget the conversation), /system TEXT (new system message, clears), \
                    /save FILE (write the conversation as JSON), /load FILE (continue a saved conversation), \
                    /tool RESULT (answer the last tool call, with --tools), /quit";

/// The tools in `path`: a JSON list of OpenAI tool objects, or `{"tools": [...]}`.
fn read_tools(path: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let bad = |why: String| Error::InvalidArgument(format!("--tools {}: {why}", path.display()));
    let value: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON ({e})")))?;
    let tools = match value {
        Value::Array(tools) => tools,
        Value::Object(mut o) => match o.remove("tools") {
            Some(Value::Array(tools)) => tools,
            _ => return Err(bad("an object without a `tools` list".into())),
        },
        _ => return Err(bad("not a list of tools".into())),
    };
    match tools.iter().all(|t| t.pointer("/function/name").is_some_and(Value::is_string)) {
        true => Ok(tools),
        false => Err(bad("each tool needs `function.name`".into())),
    }
}

/// `("/name", "rest")` for a command line, `None` for a message.
fn command(line: &str) -> Option<(&str, &str)> {
    let line = line.trim();
    if !line.starts_with('/') {
        return None;
    }
    Some(match line.split_once(char::is_whitespace) {
        Some((name, rest)) => (name, rest.trim()),
        None => (line, ""),
    })
}

impl Conversation<'_> {
    /// Back to just the system message (the session's cache is kept: the next prompt reuses
    /// whatever prefix still matches, such as the system message).
    fn reset(&mut self) {
        self.messages = self.system.iter().map(|s| ChatMessage::new(Role::System, s.clone())).collect();
    }

    /// Adds `message` (the user's turn, or a tool's result), streams the reply to stdout (its
    /// tool calls to stderr) and keeps it in the history. A reply stopped by Ctrl-C is kept as
    /// far as it got; a turn that fails is dropped.
    fn turn(&mut self, message: ChatMessage, stop: &AtomicBool) -> Result<()> {
        self.messages.push(message);
        let result = self.generate(stop);
        match result {
            Ok((text, calls)) => {
                let mut reply = ChatMessage::new(Role::Assistant, text);
                if !calls.is_empty() {
                    let calls: Vec<Value> = calls
                        .iter()
                        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
                        .collect();
                    reply.extra.insert("tool_calls".into(), Value::Array(calls));
                }
                self.messages.push(reply);
                self.request.options.sampling.seed = self.request.options.sampling.seed.wrapping_add(1);
                Ok(())
            }
            Err(e) => {
                self.messages.pop();
                Err(e)
            }
        }
    }

    /// The id of the last reply's last tool call, if it made any.
    fn last_call_id(&self) -> Option<String> {
        let last = self.messages.last().filter(|m| m.role == Role::Assistant)?;
        let calls = last.extra.get("tool_calls")?.as_array()?;
        Some(calls.last()?.get("id")?.as_str()?.to_string())
    }

    fn generate(&mut self, stop: &AtomicBool) -> Result<(String, Vec<ToolCall>)> {
        let options = RenderOptions { add_generation_prompt: true, tools: self.tools.clone(), ..Default::default() };
        let text = self.template.render(&self.messages, &options)?;
        let tokenizer = self.engine.tokenizer().expect("checked at start");
        let prompt = tokenizer.encode_raw(&text)?;
        let context = self.engine.context();
        if prompt.len() >= context {
            return Err(Error::ContextOverflow { requested: prompt.len() + 1, context });
        }
        let mut request = self.request.clone();
        request.options.max_tokens = request.options.max_tokens.min(context - prompt.len());
        let mut out = std::io::stdout().lock();
        let c = complete(self.engine, &mut self.session, &prompt, &request, |piece| {
            let _ = write!(out, "{piece}");
            let _ = out.flush();
            !stop.load(Ordering::SeqCst)
        })?;
        writeln!(out).ok();
        drop(out);
        for call in &c.tool_calls {
            eprintln!("[tool call {}: {}({})]", call.id, call.name, call.arguments);
        }
        let s = &c.generation.stats;
        let e = &s.experts;
        let experts =
            if e.expert_hits + e.expert_misses > 0 { format!("experts: {e}") } else { "experts: all resident".into() };
        eprintln!(
            "[{} prompt tokens ({} reused, {} prefilled at {:.1} tok/s), {} generated at {:.1} tok/s{}; {experts}]",
            c.generation.prompt_tokens.len(),
            s.reused_tokens,
            s.prefilled_tokens,
            s.prefill_tokens_per_s,
            c.generation.tokens.len(),
            s.decode_tokens_per_s,
            if stop.load(Ordering::SeqCst) { ", stopped" } else { "" },
        );
        Ok((c.text, c.tool_calls))
    }

    /// Continues the conversation `/save` wrote to `path` (`{"messages": [...]}`, the OpenAI
    /// shape); its system message, if any, becomes this chat's.
    fn load(&mut self, path: &Path) -> Result<()> {
        #[derive(serde::Deserialize)]
        struct Saved {
            messages: Vec<ChatMessage>,
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let saved: Saved = serde_json::from_str(&text)
            .map_err(|e| Error::InvalidArgument(format!("{}: not a saved conversation ({e})", path.display())))?;
        self.system = saved.messages.iter().find(|m| m.role == Role::System).map(|m| m.content.clone());
        self.messages = saved.messages;
        Ok(())
    }

    /// Writes `{"messages": [...]}` (the OpenAI shape) to `path`.
    fn save(&self, path: &Path) -> Result<()> {
        let json =
            serde_json::to_string_pretty(&serde_json::json!({"messages": self.messages})).expect("messages serialise");
        std::fs::write(path, json + "\n").map_err(|e| Error::io(path, e))
    }
}
