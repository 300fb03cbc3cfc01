//! The tokenizer of a GGUF file (`tokenizer.ggml.*`) as a Hugging Face `tokenizer.json`
//! document, which the `tokenizers` crate loads: `gpt2` byte-level BPE (vocabulary, merges,
//! the pre-tokenizer regex named by `tokenizer.ggml.pre`), control and user-defined tokens as
//! special added tokens, BOS/EOS added as `tokenizer.ggml.add_{bos,eos}_token` say.

use serde_json::{json, Value};

use super::{GgufModel, GgufValue};
use crate::error::{Error, Result};

/// GPT-2's split regex (what `ByteLevel` with `use_regex` applies).
const GPT2_SPLIT: Option<&str> = None;
/// Qwen2's split regex (`tokenizer.ggml.pre` = `qwen2`).
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's split regex (`llama-bpe`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn strings<'a>(m: &'a GgufModel, key: &str) -> Result<Vec<&'a str>> {
    let bad = || Error::Tokenizer(format!("GGUF `{key}` is missing or not an array of strings"));
    m.get(key).and_then(GgufValue::as_array).ok_or_else(bad)?.iter().map(|v| v.as_str().ok_or_else(bad)).collect()
}

fn flag(m: &GgufModel, key: &str) -> bool {
    matches!(m.get(key), Some(GgufValue::Bool(true)))
}

/// The `tokenizer.json` equivalent of `m`'s tokenizer.
pub fn tokenizer_json(m: &GgufModel) -> Result<Value> {
    let model = m.str("tokenizer.ggml.model").map_err(|e| Error::Tokenizer(e.to_string()))?;
    if model != "gpt2" {
        return Err(Error::Tokenizer(format!(
            "GGUF tokenizer model {model:?} is not supported (only byte-level BPE, `gpt2`)"
        )));
    }
    let tokens = strings(m, "tokenizer.ggml.tokens")?;
    let merges = strings(m, "tokenizer.ggml.merges")?;
    let types: Vec<u64> = match m.get("tokenizer.ggml.token_type").and_then(GgufValue::as_array) {
        Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
        None => vec![1; tokens.len()],
    };
    let vocab: serde_json::Map<String, Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    // Control (3) and user-defined (4) tokens match before the model, as special tokens.
    let added: Vec<Value> = tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| matches!(types.get(*i), Some(3 | 4)))
        .map(|(i, t)| {
            json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let pre = m.get("tokenizer.ggml.pre").and_then(GgufValue::as_str).unwrap_or("default");
    let split = match pre {
        "default" | "gpt2" | "olmo" => GPT2_SPLIT,
        "qwen2" => Some(QWEN2_SPLIT),
        "llama-bpe" | "llama3" => Some(LLAMA3_SPLIT),
        other => return Err(Error::Tokenizer(format!("GGUF pre-tokenizer {other:?} is not supported"))),
    };
    let pre_tokenizer = match split {
        None => json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}),
        Some(regex) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]}),
    };
    let special = |key: &str, add: &str| -> Option<(String, u64)> {
        let id = m.get(key).and_then(GgufValue::as_u64)?;
        (flag(m, add)).then(|| tokens.get(id as usize).map(|t| (t.to_string(), id)))?
    };
    let bos = special("tokenizer.ggml.bos_token_id", "tokenizer.ggml.add_bos_token");
    let eos = special("tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_eos_token");
    let post_processor = if bos.is_none() && eos.is_none() {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false})
    } else {
        let piece = |t: &(String, u64)| json!({"SpecialToken": {"id": t.0, "type_id": 0}});
        let seq: Vec<Value> = bos
            .iter()
            .map(piece)
            .chain([json!({"Sequence": {"id": "A", "type_id": 0}})])
            .chain(eos.iter().map(piece))
            .collect();
        let specials: serde_json::Map<String, Value> = bos
            .iter()
            .chain(eos.iter())
            .map(|(t, id)| (t.clone(), json!({"id": t, "ids": [id], "tokens": [t]})))
            .collect();
        json!({"type": "TemplateProcessing", "single": seq, "pair": seq, "special_tokens": specials})
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": merges},
    }))
}

/// The chat template (`tokenizer.chat_template`, Jinja), if the file has one.
pub fn chat_template(m: &GgufModel) -> Option<&str> {
    m.get("tokenizer.chat_template").and_then(GgufValue::as_str)
}
