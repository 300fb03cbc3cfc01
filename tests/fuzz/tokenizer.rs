//! Tokenizer files: mutants of `tokenizer.json` (its structure: normalizer, pre-tokenizer,
//! model type, `added_tokens`; one more added token with an odd id, content or flags; or
//! anywhere, vocabulary and merges included) through engine load,
//! encoding, scoring and a short generation with streaming decode; and mutants of
//! `tokenizer_config.json` holding a real chat template (its `chat_template` string or named
//! list, `bos_token`/`eos_token` as strings or added-token objects, `added_tokens_decoder`; or
//! the template text itself edited as `templates.rs` does) through the `chat` path: the
//! template read from the directory, rendered, end-of-turn tokens, `complete`.

use std::path::Path;
use std::sync::Arc;

use moestream::chat::{
    complete, end_of_turn_tokens, ChatMessage, ChatTemplate, CompletionRequest, RenderOptions, Role,
};
use moestream::runtime::GenerateOptions;
use moestream::{Engine, EngineOptions};
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::common;
use crate::harness::{fuzz, guarded, Outcome};
use crate::mutate::{apply_json, json_mutations, mutants, mutate_json_text, JsonMutation, Mutant};
use crate::templates::{conversation, fixture_templates, template_text, TemplateMutant};
use crate::{dir_with, fixture, text};

/// Where a `tokenizer.json` mutant goes.
#[derive(Clone, Debug)]
enum TokenizerMutant {
    /// The document without its vocabulary and merges (so mutations land on the structure).
    Structure(Vec<JsonMutation>),
    /// The whole document, or its bytes.
    Anywhere(Mutant),
    /// One more entry in `added_tokens`: odd ids (taken, past the vocabulary, huge), contents
    /// (empty, a space, an existing token, a NUL) and flags.
    AddedToken { id: u64, content: &'static str, flags: [bool; 5] },
}

fn added_tokens() -> impl Strategy<Value = TokenizerMutant> {
    let id = prop::sample::select(vec![0u64, 5, 383, 384, 1 << 31, u32::MAX as u64, u64::MAX]);
    let content = prop::sample::select(vec!["", " ", "a", "<|endoftext|>", "<|im_end|>", "\u{0}", "é😀"]);
    (id, content, any::<[bool; 5]>()).prop_map(|(id, content, flags)| TokenizerMutant::AddedToken {
        id,
        content,
        flags,
    })
}

/// `doc` with an added token appended.
fn with_added_token(
    doc: &Value,
    id: u64,
    content: &str,
    [special, lstrip, rstrip, normalized, single]: [bool; 5],
) -> Vec<u8> {
    let mut doc = doc.clone();
    let token = json!({"id": id, "content": content, "special": special, "lstrip": lstrip, "rstrip": rstrip,
                       "normalized": normalized, "single_word": single});
    doc["added_tokens"].as_array_mut().unwrap().push(token);
    serde_json::to_vec(&doc).unwrap()
}

/// `doc` with `model.vocab` and `model.merges` left out while `muts` apply, then put back
/// where the mutations left the placeholders.
fn mutate_structure(doc: &Value, muts: &[JsonMutation]) -> Vec<u8> {
    let mut doc = doc.clone();
    let vocab = doc["model"]["vocab"].take();
    let merges = doc["model"]["merges"].take();
    doc["model"]["vocab"] = json!("vocab");
    doc["model"]["merges"] = json!("merges");
    apply_json(&mut doc, muts);
    for (key, original) in [("vocab", vocab), ("merges", merges)] {
        if let Some(slot) = doc.pointer_mut(&format!("/model/{key}")).filter(|v| v.as_str() == Some(key)) {
            *slot = original;
        }
    }
    serde_json::to_vec(&doc).unwrap()
}

/// What a user does with a model's tokenizer: load, encode (with and without special tokens),
/// score the encoding, generate a few tokens (streaming decode), decode odd ids.
fn use_tokenizer(dir: &Path) -> Outcome {
    let mut options = EngineOptions::new(dir);
    options.context = Some(32);
    let engine = text(Engine::load_on(common::gpu(), &options))?;
    let tokens = text(engine.encode("Hello, world! <|endoftext|> é😀 \u{0}"))?;
    text(engine.encode_raw(" spaced  out "))?;
    if tokens.len() >= 2 {
        let score = text(engine.score(&tokens[..tokens.len().min(16)]))?;
        assert!(score.logprobs.iter().all(|l| l.is_finite()), "{:?}", score.logprobs);
    }
    let prompt = if tokens.is_empty() { vec![1] } else { tokens[..tokens.len().min(8)].to_vec() };
    text(engine.generate(&prompt, &GenerateOptions { max_tokens: 3, ..GenerateOptions::default() }, |_, _| true))?;
    let tokenizer = engine.tokenizer().expect("loaded with the engine");
    text(tokenizer.decode(&[0, 1, 383, 384, u32::MAX]))?;
    Ok(())
}

#[test]
fn tokenizer_json_through_engine() {
    let original = std::fs::read(fixture().join("tokenizer.json")).unwrap();
    let doc: Value = serde_json::from_slice(&original).unwrap();
    let strategy = prop_oneof![
        3 => json_mutations().prop_map(TokenizerMutant::Structure),
        1 => mutants().prop_map(TokenizerMutant::Anywhere),
        2 => added_tokens(),
    ];
    fuzz("tokenizer.json/engine", 48, strategy, |m| {
        let bytes = match &m {
            TokenizerMutant::Structure(muts) => mutate_structure(&doc, muts),
            TokenizerMutant::Anywhere(m) => mutate_json_text(&original, m),
            TokenizerMutant::AddedToken { id, content, flags } => with_added_token(&doc, *id, content, *flags),
        };
        let dir = dir_with(&fixture(), "tokenizer.json", &bytes);
        guarded(move || use_tokenizer(dir.path()))
    });
}

/// The fixture's `tokenizer_config.json` as an instruct model's: a chat template (Qwen3's),
/// special tokens as added-token objects and an `added_tokens_decoder`.
fn chat_config(template: &str) -> Value {
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(fixture().join("tokenizer_config.json")).unwrap()).unwrap();
    config["chat_template"] = json!(template);
    config["bos_token"] = json!({"content": "<|endoftext|>", "lstrip": false, "special": true});
    config["added_tokens_decoder"] = json!({"0": {"content": "<|endoftext|>", "special": true}});
    config
}

/// Where a `tokenizer_config.json` mutant goes.
#[derive(Clone, Debug)]
enum ConfigMutant {
    /// The document (template string included as a value).
    Document(Mutant),
    /// The template as a named list (`[{"name": "default", "template": ...}]`), mutated.
    NamedList(Vec<JsonMutation>),
    /// The template text edited.
    Template(TemplateMutant),
}

fn config_bytes(fixtures: &[String], qwen: &str, m: &ConfigMutant) -> Vec<u8> {
    match m {
        ConfigMutant::Document(m) => mutate_json_text(&serde_json::to_vec(&chat_config(qwen)).unwrap(), m),
        ConfigMutant::NamedList(muts) => {
            let mut config = chat_config(qwen);
            config["chat_template"] = json!([{"name": "tool_use", "template": "{{ tools }}"},
                                             {"name": "default", "template": qwen}]);
            apply_json(&mut config, muts);
            serde_json::to_vec(&config).unwrap()
        }
        ConfigMutant::Template(t) => serde_json::to_vec(&chat_config(&template_text(fixtures, t))).unwrap(),
    }
}

/// What `chat` does with a model directory: its template, rendered, the end-of-turn tokens,
/// the prompt tokenized raw, a reply of at most 3 tokens in a session.
fn chat_once(engine: &Engine, messages: &[ChatMessage], options: &RenderOptions) -> Outcome {
    let template = text(ChatTemplate::from_dir(engine.model_dir()))?.ok_or("no chat template")?;
    let prompt = text(template.render(messages, options))?;
    let stop_tokens = end_of_turn_tokens(engine, Some(&template));
    let tokens = text(engine.encode_raw(&prompt))?;
    let mut session = text(engine.new_session())?;
    let request = CompletionRequest {
        options: GenerateOptions { max_tokens: 3, ..GenerateOptions::default() },
        stop_tokens,
        stop_strings: vec!["<|im_end|>".into()],
        ..Default::default()
    };
    text(complete(engine, &mut session, &tokens, &request, |_| true)).map(|_| ())
}

#[test]
fn tokenizer_config_through_chat() {
    // One engine (config.json and weights never change); each mutant rewrites the config the
    // chat path reads from the engine's directory.
    let scratch = dir_with(&fixture(), "tokenizer_config.json", b"{}");
    let mut options = EngineOptions::new(scratch.path());
    options.context = Some(2048);
    let engine = Arc::new(Engine::load_on(common::gpu(), &options).unwrap());
    let fixtures = fixture_templates();
    let qwen = fixtures.iter().find(|t| t.contains("<|im_start|>") && t.contains("enable_thinking")).unwrap().clone();
    let strategy = prop_oneof![
        2 => mutants().prop_map(ConfigMutant::Document),
        1 => json_mutations().prop_map(ConfigMutant::NamedList),
        2 => crate::templates::template_mutants().prop_map(ConfigMutant::Template),
    ];
    let short = (1usize..4).prop_map(|n| vec![ChatMessage::new(Role::User, "hi"); n]);
    let messages = prop_oneof![short.prop_map(|m| (m, RenderOptions::default())), conversation()];
    fuzz("tokenizer_config.json/chat", 64, (strategy, messages), |(m, (messages, render))| {
        std::fs::write(scratch.path().join("tokenizer_config.json"), config_bytes(&fixtures, &qwen, &m)).unwrap();
        let engine = Arc::clone(&engine);
        guarded(move || chat_once(&engine, &messages, &render))
    });
}

// Regression cases: tokenizer files that panicked.

#[test]
fn regression_bpe_continuing_subword_prefix_longer_than_a_merge_panicked() {
    // `tokenizers` builds each merge as `a + b[prefix.len()..]`: a prefix longer than a merge's
    // second part (or splitting a character of it) panicked inside the crate at load.
    let mut doc: Value = serde_json::from_slice(&std::fs::read(fixture().join("tokenizer.json")).unwrap()).unwrap();
    for prefix in ["two", "##########"] {
        doc["model"]["continuing_subword_prefix"] = json!(prefix);
        let dir = dir_with(&fixture(), "tokenizer.json", &serde_json::to_vec(&doc).unwrap());
        let outcome = guarded(move || use_tokenizer(dir.path())).unwrap();
        let e = outcome.expect_err("refused");
        assert!(e.contains("continuing_subword_prefix"), "{e}");
    }
}
