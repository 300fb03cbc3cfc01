//! A model's chat template: found in its directory, compiled once, rendered per conversation.

use std::path::Path;

use minijinja::Environment;
use serde::Serialize;
use serde_json::{Map, Value};

use super::hf_jinja;
use super::message::ChatMessage;
use crate::error::{Error, Result};

/// Longest prompt text a rendering may produce (far beyond any context; a template that writes
/// more is refused before it exhausts memory).
pub const MAX_RENDERED_BYTES: usize = 64 << 20;

/// The file a model directory may hold its template in (transformers 4.43+ writes it there
/// instead of into `tokenizer_config.json`).
pub use crate::util::model_files::TEMPLATE_FILE;

/// A compiled chat template and the special-token strings it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

/// What a rendering adds to the messages.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// End with the header of an assistant turn, so the model writes the reply.
    pub add_generation_prompt: bool,
    /// Tool schemas (OpenAI's `tools`: `{"type": "function", "function": {...}}`), if any.
    pub tools: Option<Vec<Value>>,
    /// Further template variables (`enable_thinking`, `reasoning_effort`, `date_string`, ...).
    pub variables: Map<String, Value>,
}

#[derive(Serialize)]
struct Context<'a> {
    messages: &'a [ChatMessage],
    add_generation_prompt: bool,
    tools: &'a Option<Vec<Value>>,
    bos_token: &'a Option<String>,
    eos_token: &'a Option<String>,
    #[serde(flatten)]
    variables: &'a Map<String, Value>,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the strings the template sees.
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<ChatTemplate> {
        let source = source.into();
        let mut env = hf_jinja::environment();
        env.add_template_owned("chat", source.clone()).map_err(|e| Error::ChatTemplate(describe(&e)))?;
        Ok(ChatTemplate { env, source, bos_token, eos_token })
    }

    /// The template of the model in `dir`: `chat_template.jinja`, else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of named templates of which `default` is used);
    /// `None` when the model has none. Special tokens come from `tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Option<ChatTemplate>> {
        Self::with_override(dir, None)
    }

    /// [`ChatTemplate::from_dir`], or with `file` the Jinja template in it (`--chat-template`),
    /// its special tokens still from `dir`'s `tokenizer_config.json`.
    pub fn with_override(dir: &Path, file: Option<&Path>) -> Result<Option<ChatTemplate>> {
        if let Some(f) = file.filter(|f| !f.exists()) {
            return Err(Error::InvalidArgument(format!("chat template {} does not exist", f.display())));
        }
        let config_path = dir.join("tokenizer_config.json");
        let config: Value = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| Error::Json { path: config_path.clone(), message: e.to_string() })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Value::Null,
            Err(e) => return Err(Error::io(&config_path, e)),
        };
        let file = file.map_or_else(|| dir.join(TEMPLATE_FILE), Path::to_path_buf);
        let source = if file.exists() {
            std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?
        } else {
            match config.get("chat_template") {
                None | Some(Value::Null) => return Ok(None),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template")?.as_str())
                    .ok_or_else(|| {
                        Error::ChatTemplate(format!("{}: no template named \"default\"", config_path.display()))
                    })?
                    .to_string(),
                Some(_) => {
                    return Err(Error::Json {
                        path: config_path,
                        message: "chat_template must be a string or a list".into(),
                    })
                }
            }
        };
        let token = |name: &str| match config.get(name) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(added)) => added.get("content").and_then(Value::as_str).map(str::to_string),
            _ => None,
        };
        ChatTemplate::new(source, token("bos_token"), token("eos_token")).map(Some)
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The end-of-sequence string the template is rendered with.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The prompt text of `messages` (special tokens as text: tokenize it without adding more).
    pub fn render(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<String> {
        let context = Context {
            messages,
            add_generation_prompt: options.add_generation_prompt,
            tools: &options.tools,
            bos_token: &self.bos_token,
            eos_token: &self.eos_token,
            variables: &options.variables,
        };
        let template = self.env.get_template("chat").map_err(|e| Error::ChatTemplate(describe(&e)))?;
        let mut out = CappedText::default();
        match template.render_captured_to(context, &mut out) {
            Ok(_) => String::from_utf8(out.bytes).map_err(|_| Error::ChatTemplate("rendered text is not UTF-8".into())),
            Err(_) if out.overflowed => {
                Err(Error::ChatTemplate(format!("the template writes more than {MAX_RENDERED_BYTES} bytes of prompt")))
            }
            Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => Err(Error::ChatTemplate(format!(
                "the template ran more than {} instructions (a loop that does not end?)",
                hf_jinja::TEMPLATE_FUEL
            ))),
            Err(e) => Err(Error::ChatTemplate(describe(&e))),
        }
    }
}

/// Rendered text, refusing to grow past [`MAX_RENDERED_BYTES`].
#[derive(Default)]
struct CappedText {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for CappedText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDERED_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("rendered prompt too long"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An error with its cause chain (minijinja puts the template line in the chain).
fn describe(e: &minijinja::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}
