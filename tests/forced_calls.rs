//! Forced tool calls (`tool_choice` `"required"` or a named function) in the formats written
//! with special tokens: GLM-4.5, Mistral (its JSON list and its v11 `NAME[ARGS]` layout),
//! DeepSeek-V3.1 and V3, gpt-oss harmony. Random-weight fixture models decode under the call's
//! grammar through `chat::complete`, and the reply must come back through the format's own
//! parser as one call to an offered function, its arguments valid against the function's
//! schema (`jsonschema`), with `finish_reason` `tool_calls`; once with the markers as special
//! tokens of the vocabulary (the reply must open with the opening marker's token) and once with
//! a vocabulary that lacks them (the markers are then text). GLM-4.5's calls, whose string
//! values are written raw and the others as JSON, also for parameter schemas drawn at random
//! (proptest). A call after a prompt that leaves the reply inside `<think>` closes it first.

mod common;

use std::path::Path;

use common::{fixtures_dir, gpu, with_special_tokens, TempDir};
use moestream::chat::{
    complete, end_of_turn_tokens, is_harmony, thinking_start, ChatTemplate, CompletionRequest, FinishReason,
    ToolChoice, ToolFormat,
};
use moestream::ops::WeightFormat;
use moestream::runtime::{Engine, EngineOptions, GenerateOptions, SamplingParams};
use proptest::prelude::*;
use serde_json::{json, Value};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
         "parameters": {"type": "object", "properties": {
             "city": {"type": "string", "maxLength": 16},
             "days": {"type": "integer", "minimum": 1, "maximum": 14},
             "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
             "a": {"type": "integer", "minimum": -99, "maximum": 99},
             "b": {"type": "integer", "minimum": -99, "maximum": 99}},
           "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

fn template(name: &str) -> String {
    std::fs::read_to_string(fixtures_dir().join("chat_templates").join(format!("{name}.jinja"))).unwrap()
}

/// A format's case: the fixture model, the template source (a family's real template, or a
/// few lines written here that say what its template writes), the format it must be read as,
/// and its markers, the first the call's opening one.
struct Case {
    fixture: &'static str,
    source: String,
    format: ToolFormat,
    markers: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    let deepseek = common::DEEPSEEK_TOOL_MARKERS;
    vec![
        Case {
            fixture: "glm4_moe",
            source: "{%- for m in messages %}{{ m.content }}{%- endfor %}<tool_call>{function-name}\n\
                     <arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n</tool_call>"
                .into(),
            format: ToolFormat::Glm,
            markers: &["<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"],
        },
        Case {
            fixture: "mixtral",
            source: template("mistralai-Mistral-Nemo-Instruct-2407"),
            format: ToolFormat::Mistral,
            markers: &["[TOOL_CALLS]"],
        },
        Case {
            fixture: "mixtral",
            source: "{%- for m in messages %}{{ m.content }}{%- endfor %}{{ '[TOOL_CALLS]' + name + '[ARGS]' + args }}"
                .into(),
            format: ToolFormat::MistralV11,
            markers: &["[TOOL_CALLS]", "[ARGS]"],
        },
        Case {
            fixture: "deepseek_v3",
            source: template("deepseek-ai-DeepSeek-V3.1"),
            format: ToolFormat::DeepSeek,
            markers: deepseek,
        },
        Case {
            fixture: "deepseek_v3",
            source:
                "{%- for m in messages %}{{ m.content }}{%- endfor %}{{ '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' \
                     + type + '<｜tool▁sep｜>' + name + '\\n```json\\n' + args + '\\n```<｜tool▁call▁end｜>' }}"
                    .into(),
            format: ToolFormat::DeepSeekV3,
            markers: deepseek,
        },
        Case {
            fixture: "gpt_oss",
            source: template("openai-gpt-oss-120b"),
            format: ToolFormat::Harmony,
            markers: &["<|channel|>", "<|message|>", "<|constrain|>", "<|call|>", "<|start|>", "<|end|>", "<|return|>"],
        },
    ]
}

fn engine(dir: &Path, cache: &TempDir) -> Engine {
    let mut o = EngineOptions::new(dir).with_format(WeightFormat::F32);
    o.context = Some(512);
    o.cache_dir = Some(cache.path().to_path_buf());
    Engine::load_on(gpu(), &o).unwrap()
}

/// Checks that `arguments` (JSON text) are valid for the function `name` of [`tools`].
fn check_arguments(name: &str, arguments: &str, what: &str) {
    check_arguments_of(&tools(), name, arguments, what);
}

/// Checks that `arguments` (JSON text) are valid for the function `name` of `tools`.
fn check_arguments_of(tools: &Value, name: &str, arguments: &str, what: &str) {
    let function = tools.as_array().unwrap().iter().map(|t| &t["function"]).find(|f| f["name"] == name);
    let function = function.unwrap_or_else(|| panic!("{what}: a call to {name:?}, no such tool"));
    let value: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{what}: {arguments:?}: {e}"));
    if let Err(e) = jsonschema::validate(&function["parameters"], &value) {
        panic!("{what}: {arguments} does not fit {name}'s parameters: {e}");
    }
}

#[test]
fn forced_calls_in_special_token_formats_parse_into_valid_calls() {
    let cache = TempDir::new("forced-calls");
    let tools: Vec<Value> = tools().as_array().unwrap().clone();
    for case in cases() {
        assert_eq!(ToolFormat::of_template(&case.source), Some(case.format), "{:?}'s template", case.format);
        let fixture = fixtures_dir().join(case.fixture);
        let (special, ids) = with_special_tokens(&fixture, case.markers);
        for (dir, special_tokens) in [(special.path(), true), (fixture.as_path(), false)] {
            let e = engine(dir, &cache);
            let tokenizer = e.tokenizer().unwrap();
            let template = ChatTemplate::new(case.source.clone(), None, Some("<|endoftext|>".into())).unwrap();
            let prompt = e.encode_raw("Weather in Paris?").unwrap();
            for (seed, choice) in
                [(1, ToolChoice::Required), (2, ToolChoice::Named("get_weather".into())), (3, ToolChoice::Required)]
            {
                let what = format!("{:?}, special tokens {special_tokens}, seed {seed}, {choice:?}", case.format);
                let mut request = CompletionRequest {
                    options: GenerateOptions {
                        max_tokens: 400,
                        sampling: SamplingParams { temperature: 1.0, seed, ..Default::default() },
                        ..Default::default()
                    },
                    stop_tokens: end_of_turn_tokens(&e, Some(&template)),
                    ..Default::default()
                };
                request.use_tools(&case.source, &tools, &choice, tokenizer).unwrap();
                request.read_markers(tokenizer, is_harmony(&case.source));
                let mut session = e.new_session().unwrap();
                let c = complete(&e, &mut session, &prompt, &request, |_| true).unwrap();
                let text = tokenizer.decode(&c.generation.tokens).unwrap_or_default();
                assert_eq!(c.tool_calls.len(), 1, "{what}: {c:?} ({text:?})");
                assert_eq!(c.finish_reason, FinishReason::ToolCalls, "{what}: {c:?}");
                assert_eq!(c.text, "", "{what}: {c:?}");
                let call = &c.tool_calls[0];
                if let ToolChoice::Named(name) = &choice {
                    assert_eq!(&call.name, name, "{what}");
                }
                check_arguments(&call.name, &call.arguments, &what);
                if special_tokens {
                    // The call opens with its marker's special token, not with text spelling it.
                    assert_eq!(c.generation.tokens.first(), Some(&ids[0].0), "{what}: {:?}", c.generation.tokens);
                }
            }
        }
    }
}

#[test]
fn a_forced_call_after_a_prompt_inside_the_reasoning_closes_it_first() {
    // DeepSeek-R1's templates end the prompt inside `<think>`: unclosed, the call would be
    // reasoning and come back as no call.
    let cache = TempDir::new("forced-calls-thinking");
    let source =
        "{%- for m in messages %}{{ m.content }}{%- endfor %}{{ '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' \
                  + type + '<｜tool▁sep｜>' + name + '\\n```json\\n' + args + '\\n```<｜tool▁call▁end｜>' }}\
                  {{ '<｜Assistant｜><think>\\n' }}";
    let rendered = "Weather in Paris?<｜Assistant｜><think>\n";
    let case = cases().into_iter().find(|c| c.format == ToolFormat::DeepSeekV3).unwrap();
    let markers = [case.markers, &["</think>"]].concat();
    let fixture = fixtures_dir().join(case.fixture);
    let (special, ids) = with_special_tokens(&fixture, &markers);
    let tools: Vec<Value> = tools().as_array().unwrap().clone();
    for (dir, special_tokens) in [(special.path(), true), (fixture.as_path(), false)] {
        let e = engine(dir, &cache);
        let tokenizer = e.tokenizer().unwrap();
        let mut request = CompletionRequest {
            options: GenerateOptions {
                max_tokens: 400,
                sampling: SamplingParams { temperature: 1.0, seed: 4, ..Default::default() },
                ..Default::default()
            },
            reasoning: thinking_start(source, rendered),
            ..Default::default()
        };
        assert_eq!(request.reasoning, Some(true));
        request.use_tools(source, &tools, &ToolChoice::Required, tokenizer).unwrap();
        request.constrain_after_reasoning(tokenizer);
        request.read_markers(tokenizer, false);
        let prompt = e.encode_raw(rendered).unwrap();
        let mut session = e.new_session().unwrap();
        let c = complete(&e, &mut session, &prompt, &request, |_| true).unwrap();
        let what = format!("special tokens {special_tokens}: {c:?}");
        assert_eq!((c.tool_calls.len(), c.reasoning.as_str(), c.text.as_str()), (1, "", ""), "{what}");
        check_arguments(&c.tool_calls[0].name, &c.tool_calls[0].arguments, &what);
        if special_tokens {
            let close = ids.iter().find(|(_, t)| t == "</think>").unwrap().0;
            assert_eq!(c.generation.tokens.first(), Some(&close), "{what}");
        }
    }
}

/// A tool's parameters of one to four properties, string-heavy (GLM-4.5 writes plain strings
/// raw): bounded strings, string enums some of whose options read as JSON (so they cannot be
/// raw), a string with a pattern, a nullable string, integers in a range, booleans, short
/// integer arrays; some required.
fn parameters_strategy() -> impl Strategy<Value = Value> {
    let option = prop_oneof!["[a-z ]{1,5}", Just("12".to_string()), Just("true".to_string()), Just("-x".to_string())];
    let property = prop_oneof![
        (0usize..3, 1usize..10)
            .prop_map(|(min, span)| json!({"type": "string", "minLength": min, "maxLength": min + span})),
        proptest::collection::vec(option, 1..4).prop_map(|v| json!({"type": "string", "enum": v})),
        Just(json!({"type": "string", "pattern": "^[a-c]{1,3}$"})),
        Just(json!({"type": ["string", "null"], "maxLength": 6})),
        (-20i64..20, 1i64..30).prop_map(|(lo, span)| json!({"type": "integer", "minimum": lo, "maximum": lo + span})),
        Just(json!({"type": "boolean"})),
        (1usize..4).prop_map(
            |n| json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": n})
        ),
    ];
    proptest::collection::vec((property, any::<bool>()), 1..5).prop_map(|props| {
        let names: Vec<String> = (0..props.len()).map(|i| format!("k{i}")).collect();
        let properties: serde_json::Map<String, Value> =
            names.iter().cloned().zip(props.iter().map(|(p, _)| p.clone())).collect();
        let required: Vec<&String> = names.iter().zip(&props).filter(|(_, (_, r))| *r).map(|(n, _)| n).collect();
        json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
    })
}

#[test]
fn glm_calls_of_random_parameter_schemas_parse_back_valid() {
    let cache = TempDir::new("forced-calls-random");
    let case = cases().into_iter().find(|c| c.format == ToolFormat::Glm).unwrap();
    let (dir, _) = with_special_tokens(&fixtures_dir().join(case.fixture), case.markers);
    let e = engine(dir.path(), &cache);
    let tokenizer = e.tokenizer().unwrap();
    let prompt = e.encode_raw("Call it.").unwrap();
    let config = ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |(parameters in parameters_strategy(), seed in 0u64..1000)| {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": parameters}}]);
        let mut request = CompletionRequest {
            options: GenerateOptions {
                max_tokens: 400,
                sampling: SamplingParams { temperature: 1.0, seed, ..Default::default() },
                ..Default::default()
            },
            ..Default::default()
        };
        request.use_tools(&case.source, tools.as_array().unwrap(), &ToolChoice::Required, tokenizer).unwrap();
        request.read_markers(tokenizer, false);
        let mut session = e.new_session().unwrap();
        let c = complete(&e, &mut session, &prompt, &request, |_| true).unwrap();
        let what = format!("{parameters}, seed {seed}: {:?}", tokenizer.decode(&c.generation.tokens));
        prop_assert_eq!(c.tool_calls.len(), 1, "{}", what);
        check_arguments_of(&tools, &c.tool_calls[0].name, &c.tool_calls[0].arguments, &what);
    });
}
