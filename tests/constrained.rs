//! Constrained decoding (llguidance): sampled text follows its JSON schema (checked by the
//! `jsonschema` crate), regex or Lark grammar on models with different tokenizers (byte-level
//! BPE from `tokenizer.json`, a GGUF's), through `generate` and the scheduler; schemas drawn at
//! random (proptest) all give valid JSON; bad constraints are refused by name, and drafts with
//! a constraint are refused.

mod common;

use std::path::{Path, PathBuf};

use common::{fixtures_dir, gpu, TempDir};
use moestream::ops::WeightFormat;
use moestream::runtime::{Constraint, Engine, EngineOptions, GenerateOptions, SamplingParams, Scheduler};
use proptest::prelude::*;
use serde_json::{json, Value};

fn engine(path: &Path, cache: &TempDir) -> Engine {
    let mut o = EngineOptions::new(path);
    if !moestream::model::gguf::arch::is_gguf(path) {
        o = o.with_format(WeightFormat::F32);
    }
    o.context = Some(512);
    o.cache_dir = Some(cache.path().to_path_buf());
    Engine::load_on(gpu(), &o).unwrap()
}

fn bundled() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe")
}

/// Sampled at temperature 1 (random weights pick anything the mask leaves), up to 300 tokens.
fn sampled(constraint: Constraint, seed: u64) -> GenerateOptions {
    GenerateOptions {
        max_tokens: 300,
        sampling: SamplingParams { temperature: 1.0, seed, ..Default::default() },
        constraint: Some(constraint),
        ..Default::default()
    }
}

/// Compact JSON (no free whitespace: random weights would otherwise write spaces for ever).
fn compact(mut schema: Value) -> Value {
    schema["x-guidance"] = json!({"whitespace_flexible": false});
    schema
}

/// Parses `text` as JSON valid against `schema`.
fn check_json(schema: &Value, text: &str, what: &str) {
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {text:?} is not JSON: {e}"));
    if let Err(e) = jsonschema::validate(schema, &value) {
        panic!("{what}: {text} does not follow {schema}: {e}");
    }
}

fn person() -> Value {
    compact(json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "role": {"enum": ["judge", "jury", "clerk"]},
            "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        },
        "required": ["name", "age", "role"],
        "additionalProperties": false,
    }))
}

#[test]
fn sampled_text_follows_its_schema_regex_and_grammar_on_each_tokenizer() {
    let cache = TempDir::new("constrained");
    let models = [bundled(), fixtures_dir().join("qwen3_moe"), fixtures_dir().join("gguf/qwen3_moe-q4km.gguf")];
    for model in &models {
        let e = engine(model, &cache);
        let prompt = e.encode("The jury said").unwrap();
        let what = model.display().to_string();
        for seed in 0..3 {
            let g = e.generate(&prompt, &sampled(Constraint::JsonSchema(person()), seed), |_, _| true).unwrap();
            check_json(&person(), &g.text, &what);
            assert!(g.tokens.len() < 300, "{what}: the grammar ended the text");
        }
        // Any object: unbounded (keys and strings of any length), so random weights may write
        // until the token limit; one that ends is an object.
        let g = e.generate(&prompt, &sampled(Constraint::JsonObject, 7), |_, _| true).unwrap();
        assert!(g.text.starts_with('{'), "{what}: {:?}", g.text);
        if g.tokens.len() < 300 {
            assert!(serde_json::from_str::<Value>(&g.text).is_ok_and(|v| v.is_object()), "{what}: {:?}", g.text);
        }
        // A regex, whole.
        let g = e.generate(&prompt, &sampled(Constraint::Regex("[0-9]{3}-[a-z]{2,4}".into()), 1), |_, _| true);
        let text = g.unwrap().text;
        let (digits, letters) = text.split_once('-').unwrap_or_else(|| panic!("{what}: {text:?}"));
        assert!(digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()), "{what}: {text:?}");
        assert!(
            (2..=4).contains(&letters.len()) && letters.bytes().all(|b| b.is_ascii_lowercase()),
            "{what}: {text:?}"
        );
        // A Lark grammar.
        let lark = "start: answer \".\"\nanswer: \"yes\" | \"no\" | \"not \" answer";
        let g = e.generate(&prompt, &sampled(Constraint::Lark(lark.into()), 2), |_, _| true);
        let text = g.unwrap().text;
        assert!(text.trim_start_matches("not ").strip_suffix('.').is_some_and(|t| t == "yes" || t == "no"), "{text:?}");
    }
}

#[test]
fn the_scheduler_constrains_each_request_its_own_way_and_as_alone() {
    let cache = TempDir::new("constrained_scheduler");
    let e = engine(&fixtures_dir().join("qwen3_moe"), &cache);
    let prompt = e.encode("Hello").unwrap();
    let mut scheduler = Scheduler::new(&e, 3).unwrap();
    let constraints = [Some(Constraint::JsonSchema(person())), None, Some(Constraint::Regex("(ab)+c".into()))];
    let options: Vec<_> = constraints
        .iter()
        .enumerate()
        .map(|(i, c)| GenerateOptions { constraint: c.clone(), ..sampled(Constraint::JsonObject, i as u64) })
        .collect();
    let ids: Vec<_> = options
        .iter()
        .map(|o| scheduler.submit(prompt.clone(), o.clone(), Box::new(|_, _, _| true)).unwrap())
        .collect();
    let mut done = Vec::new();
    while done.len() < ids.len() {
        done.extend(scheduler.step().unwrap());
    }
    for f in done {
        let g = f.result.unwrap();
        let i = ids.iter().position(|&id| id == f.id).unwrap();
        match i {
            0 => check_json(&person(), &g.text, "scheduled"),
            2 => assert!(g.text.ends_with('c') && g.text[..g.text.len() - 1].len() % 2 == 0, "{:?}", g.text),
            _ => {}
        }
        // The masks computed beside each batched step are the ones its request needs: the
        // tokens are those the request samples alone with its seed.
        assert_eq!(g.tokens, e.generate(&prompt, &options[i], |_, _| true).unwrap().tokens, "request {i}");
    }
    // A schema that does not compile is refused at submit, by name.
    let bad =
        GenerateOptions { constraint: Some(Constraint::JsonSchema(json!({"type": "wat"}))), ..Default::default() };
    let e2 = scheduler.submit(prompt.clone(), bad, Box::new(|_, _, _| true)).unwrap_err().to_string();
    assert!(e2.contains("JSON schema"), "{e2}");
}

#[test]
fn bad_constraints_and_drafts_with_one_are_refused() {
    let cache = TempDir::new("constrained_bad");
    let e = engine(&bundled(), &cache);
    let prompt = e.encode("The").unwrap();
    for (constraint, said) in [
        (Constraint::JsonSchema(json!({"type": "wat"})), "JSON schema"),
        (Constraint::Regex("(unclosed".into()), "regex"),
        (Constraint::Lark("start: undefined_rule".into()), "grammar"),
    ] {
        let options = GenerateOptions { constraint: Some(constraint), ..Default::default() };
        let err = e.generate(&prompt, &options, |_, _| true).unwrap_err().to_string();
        assert!(err.contains(said), "{err}");
    }
    let drafts = Some(moestream::runtime::drafts::PromptLookup { ngram: 3, max_draft: 4 });
    let options = GenerateOptions { drafts, ..sampled(Constraint::JsonObject, 0) };
    let err = e.generate(&prompt, &options, |_, _| true).unwrap_err().to_string();
    assert!(err.contains("drafts with a constraint"), "{err}");
}

/// A schema of one to four properties, each an integer in a range, a boolean, a short string,
/// an enum or a short array of integers, some required.
fn schema_strategy() -> impl Strategy<Value = Value> {
    let property = prop_oneof![
        (0i64..50, 1i64..50).prop_map(|(lo, span)| json!({"type": "integer", "minimum": lo, "maximum": lo + span})),
        Just(json!({"type": "boolean"})),
        (1usize..10).prop_map(|n| json!({"type": "string", "maxLength": n})),
        proptest::collection::vec("[a-z]{1,6}", 1..4).prop_map(|v| json!({"enum": v})),
        (1usize..4).prop_map(
            |n| json!({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "maxItems": n})
        ),
    ];
    proptest::collection::vec((property, any::<bool>()), 1..5).prop_map(|props| {
        let names: Vec<String> = (0..props.len()).map(|i| format!("p{i}")).collect();
        let properties: serde_json::Map<String, Value> =
            names.iter().cloned().zip(props.iter().map(|(p, _)| p.clone())).collect();
        let required: Vec<&String> = names.iter().zip(&props).filter(|(_, (_, r))| *r).map(|(n, _)| n).collect();
        compact(
            json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false}),
        )
    })
}

#[test]
fn schemas_drawn_at_random_all_give_valid_json() {
    let cache = TempDir::new("constrained_random");
    let e = engine(&fixtures_dir().join("qwen3_moe"), &cache);
    let prompt = e.encode("Hello").unwrap();
    let config = ProptestConfig { cases: 16, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |(schema in schema_strategy(), seed in 0u64..1000)| {
        let g = e.generate(&prompt, &sampled(Constraint::JsonSchema(schema.clone()), seed), |_, _| true).unwrap();
        check_json(&schema, &g.text, "random schema");
    });
}
