//! `tokenizer.json` through the Hugging Face `tokenizers` crate, with streaming decode.

use std::path::Path;

use crate::error::{Error, Result};

/// A loaded tokenizer.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::Tokenizer(format!("{} not found", path.display())));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let inner = parse(&text).map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Tokenizer { inner, chat_template: None })
    }

    /// The tokenizer stored in a GGUF file's metadata, with its chat template.
    pub fn from_gguf(m: &crate::model::gguf::GgufModel) -> Result<Tokenizer> {
        let json = crate::model::gguf::tokenizer::tokenizer_json(m)?.to_string();
        let inner = parse(&json).map_err(|e| Error::Tokenizer(format!("GGUF tokenizer: {e}")))?;
        let chat_template = crate::model::gguf::tokenizer::chat_template(m).map(str::to_string);
        Ok(Tokenizer { inner, chat_template })
    }

    /// The Jinja chat template shipped with the tokenizer (GGUF `tokenizer.chat_template`).
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Token ids of `text`, with the special tokens the tokenizer's post-processor adds (as
    /// transformers' `tokenizer(text)` does).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, true).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids of `text` exactly as written: no special tokens added (for rendered chat
    /// templates, which already hold them, as transformers' `apply_chat_template` tokenizes).
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The id of a token given by its text (e.g. a special token), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The `tokenizers` crate's tokenizer underneath (constrained decoding reads each token's
    /// bytes from its `tokenizer.json` form).
    pub(crate) fn hf(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Text of `ids`, skipping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| Error::Tokenizer(e.to_string()))
    }
}

/// A `tokenizer.json` document, checked first for what the `tokenizers` crate would panic on.
fn parse(json: &str) -> std::result::Result<tokenizers::Tokenizer, String> {
    let doc: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    check_bpe_merges(&doc)?;
    json.parse().map_err(|e: tokenizers::Error| e.to_string())
}

/// A BPE model's merged pairs `(a, b)` form `a + b[prefix..]` (without the
/// `continuing_subword_prefix`), which `tokenizers` slices without checking: every `b` must
/// be at least as long as the prefix.
fn check_bpe_merges(doc: &serde_json::Value) -> std::result::Result<(), String> {
    use serde_json::Value;
    let model = &doc["model"];
    let prefix = match (&model["type"], &model["continuing_subword_prefix"]) {
        (Value::String(t), Value::String(p)) if t == "BPE" => p.len(),
        _ => return Ok(()),
    };
    let merges = model["merges"].as_array().map(Vec::as_slice).unwrap_or_default();
    let second = |m: &Value| match m {
        Value::String(s) => s.split_once(' ').map(|(_, b)| b.to_string()),
        Value::Array(pair) => pair.get(1).and_then(Value::as_str).map(str::to_string),
        _ => None,
    };
    match merges.iter().filter_map(second).find(|b| !b.is_char_boundary(prefix)) {
        Some(b) => Err(format!(
            "model.continuing_subword_prefix is {prefix} bytes long, which merge part {b:?} is shorter than or \
             splits a character at"
        )),
        None => Ok(()),
    }
}

/// Turns a growing token sequence into text pieces, holding back incomplete UTF-8.
pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    emitted: usize,
}

impl<'a> TextStream<'a> {
    /// An empty stream.
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        TextStream { tokenizer, ids: Vec::new(), emitted: 0 }
    }

    /// Adds a token and returns the new text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') || text.len() < self.emitted || !text.is_char_boundary(self.emitted) {
            return Ok(String::new());
        }
        let piece = text[self.emitted..].to_string();
        self.emitted = text.len();
        Ok(piece)
    }
}
