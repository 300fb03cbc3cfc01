//! The tokenizer of a GGUF file (`tokenizer.ggml.*`) as a Hugging Face `tokenizer.json`
//! document, which the `tokenizers` crate loads: `gpt2` byte-level BPE (vocabulary, merges,
//! the pre-tokenizer regex named by `tokenizer.ggml.pre`) or `llama` SentencePiece (pieces and
//! scores: a BPE with byte fallback whose merges are every split of a piece into two pieces,
//! ranked by the merged piece's score, as transformers' SentencePiece converter builds them; a
//! `▁` prefix and spaces as `▁`, the prefix also after a special token, as llama.cpp and
//! transformers' legacy Llama tokenizer do, where sentencepiece itself does not); control and user-defined tokens as special added tokens,
//! BOS/EOS added as `tokenizer.ggml.add_{bos,eos}_token` say.

use serde_json::{json, Value};

use super::{GgufModel, GgufValue};
use crate::error::{Error, Result};

/// GPT-2's split regex (what `ByteLevel` with `use_regex` applies).
const GPT2_SPLIT: Option<&str> = None;
/// Qwen2's split regex (`tokenizer.ggml.pre` = `qwen2`).
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's split regex (`qwen35`: Qwen2's with combining marks kept in words), as its
/// tokenizer.json has it.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
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
    let spm = match model {
        "gpt2" => false,
        "llama" => true,
        other => {
            return Err(Error::Tokenizer(format!(
                "GGUF tokenizer model {other:?} is not supported (byte-level BPE `gpt2` and SentencePiece `llama` are)"
            )))
        }
    };
    let tokens = strings(m, "tokenizer.ggml.tokens")?;
    let types: Vec<u64> = match m.get("tokenizer.ggml.token_type").and_then(GgufValue::as_array) {
        Some(a) => a.iter().map(|v| v.as_u64().unwrap_or(1)).collect(),
        None => vec![1; tokens.len()],
    };
    let vocab: serde_json::Map<String, Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    let merges: Vec<String> = if spm { spm_merges(m, &tokens)? } else { owned(strings(m, "tokenizer.ggml.merges")?) };
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
        _ if spm => None,
        // llama.cpp spells GPT-2's pre-tokenizer `gpt-2` (its converter writes that).
        "default" | "gpt2" | "gpt-2" | "olmo" => GPT2_SPLIT,
        "qwen2" => Some(QWEN2_SPLIT),
        "qwen35" => Some(QWEN35_SPLIT),
        "llama-bpe" | "llama3" => Some(LLAMA3_SPLIT),
        other => return Err(Error::Tokenizer(format!("GGUF pre-tokenizer {other:?} is not supported"))),
    };
    let pre_tokenizer = match split {
        None if spm => Value::Null,
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
    let post_processor = if bos.is_none() && eos.is_none() && spm {
        Value::Null
    } else if bos.is_none() && eos.is_none() {
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
    let (normalizer, decoder, unk) = if spm {
        let unk = m.get("tokenizer.ggml.unknown_token_id").and_then(GgufValue::as_u64);
        (
            json!({"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "\u{2581}"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]}),
            json!({"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}),
            unk.and_then(|id| tokens.get(id as usize)).map(|t| json!(t)).unwrap_or(Value::Null),
        )
    } else {
        (
            Value::Null,
            json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
            Value::Null,
        )
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": spm, "byte_fallback": spm,
                  "ignore_merges": false, "vocab": vocab, "merges": merges},
    }))
}

fn owned(v: Vec<&str>) -> Vec<String> {
    v.into_iter().map(str::to_string).collect()
}

/// SentencePiece BPE merges: every split of a normal piece into two pieces of the vocabulary,
/// pieces by descending score, a piece's splits by (left id, right id).
fn spm_merges(m: &GgufModel, tokens: &[&str]) -> Result<Vec<String>> {
    let scores: Vec<f64> = m
        .get("tokenizer.ggml.scores")
        .and_then(GgufValue::as_array)
        .map(|a| a.iter().filter_map(GgufValue::as_f64).collect())
        .filter(|s: &Vec<f64>| s.len() == tokens.len())
        .ok_or_else(|| Error::Tokenizer("GGUF `tokenizer.ggml.scores` is missing or mis-sized".into()))?;
    let ids: std::collections::HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut merges: Vec<(f64, usize, usize, String)> = Vec::new();
    for (piece, score) in tokens.iter().zip(&scores) {
        let mut local: Vec<(usize, usize, String)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (l, r) = piece.split_at(at);
                Some((*ids.get(l)?, *ids.get(r)?, format!("{l} {r}")))
            })
            .collect();
        local.sort();
        merges.extend(local.into_iter().map(|(l, r, s)| (*score, l, r, s)));
    }
    // Stable: a piece's splits keep their order.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    Ok(merges.into_iter().map(|(_, _, _, s)| s).collect())
}

/// The chat template (`tokenizer.chat_template`, Jinja), if the file has one.
pub fn chat_template(m: &GgufModel) -> Option<&str> {
    m.get("tokenizer.chat_template").and_then(GgufValue::as_str)
}
