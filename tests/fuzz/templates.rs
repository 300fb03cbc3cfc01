//! Chat templates: the real templates of `tests/fixtures/chat_templates/` with spans deleted,
//! duplicated or replaced by hostile fragments (loops that never end, self-calling macros,
//! huge repeats and indents, bad filters and method calls), and templates made only of such
//! fragments, each rendered with a random message list (roles, text, tool calls, wrong-typed
//! extra fields). The property: a rendering or a typed `chat template:` error, never a panic
//! or a hang.

use std::time::Duration;

use moestream::chat::{ChatMessage, ChatTemplate, RenderOptions, Role};
use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

use crate::common;
use crate::harness::{fuzz, guarded_within, Outcome};

/// Longest a rendering may take: the fuel bound ends a runaway loop within seconds.
const RENDER_HANG: Duration = Duration::from_secs(30);

const ENDLESS_LOOP: &str = "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}";
const SELF_CALLING_MACRO: &str = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
const SELF_CALLING_MACRO_IN_A_LOOP: &str =
    "{% macro g() %}{% for m in messages %}{{ g() }}{% endfor %}{% endmacro %}{{ g() }}";
const ENDLESS_RECURSIVE_LOOP: &str = "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}";

/// Template fragments that stress the renderer's bounds, or call what may fail.
const HOSTILE: &[&str] = &[
    ENDLESS_LOOP,
    SELF_CALLING_MACRO,
    SELF_CALLING_MACRO_IN_A_LOOP,
    ENDLESS_RECURSIVE_LOOP,
    "{{ 'ab' * 99999999 }}",
    "{% for i in range(1000) %}{{ 'x' * 99999 }}{% endfor %}",
    "{{ messages | tojson(indent=1000000000000) }}",
    "{{ messages | tojson(indent=-1) }}",
    "{{ messages | tojson(separators=[1]) }}",
    "{{ tools | tojson(sort_keys=true, indent=2) }}",
    "{{ 'x' | center(1000000000000) }}",
    "{{ 'x' | indent(1000000000000) }}",
    "{{ '{:>1000000000000}'.format(1) }}",
    "{{ '%s %s' | format(1) }}",
    "{{ 'abc'.split('') }}",
    "{{ 'abc'.replace('', 'x' * 999999) }}",
    "{{ 'abc'.startswith(1) }}{{ 'abc'.endswith(()) }}",
    "{{ strftime_now('%Q %') }}",
    "{{ raise_exception('refused') }}",
    "{{ 1 / 0 }}{{ 1 // 0 }}{{ 1 % 0 }}",
    "{{ 2 ** 200 }}{{ 9223372036854775807 + 1 }}{{ -9223372036854775807 - 2 }}",
    "{{ messages[-1000000000000] }}{{ messages[1:2:0] }}",
    "{{ messages | batch(0) | list }}{{ messages | slice(0) | list }}",
    "{{ messages[0].content[::-1] }}{{ messages[0].tool_calls[0].function.arguments | tojson }}",
    "{% set ns = namespace(x=0) %}{% for m in messages %}{% set ns.x = ns.x + m.content | length %}{% endfor %}{{ ns.x }}",
    "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{% continue %}{% endfor %}",
    "{{ range(9223372036854775807) | list }}",
    "{{ messages | map(attribute='role') | join(',') }}{{ messages | selectattr('role', 'equalto', 1) | list }}",
    "{% include 'other' %}{% extends 'chat' %}{% import 'chat' as x %}",
    "{{ bos_token ~ eos_token }}{{ add_generation_prompt is defined }}",
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}{% endif %}",
    "{{ (messages | first).keys() | list }}{{ messages[0].items() | list }}{{ messages[0].get('x', 1) }}",
    "{% for k, v in messages[0] | dictsort %}{{ k }}={{ v }}{% endfor %}",
    "{{ '<|im_start|>' }}{{ eos_token }}",
    "{% filter upper %}{{ messages | length }}{% endfilter %}",
    "{{ lipsum(1000000000) }}{{ cycler(1, 2).next() }}{{ dict(a=1) | items | list }}",
    "{%",
    "{{",
    "{% endfor %}",
    "{% endif %}",
    "}}",
    "{#",
    "{% raw %}",
];

/// Building blocks of plain templates, so that made-up templates also do ordinary work.
const ORDINARY: &[&str] = &[
    "{% for message in messages %}",
    "{% endfor %}",
    "{% if add_generation_prompt %}",
    "{% elif message.role == 'user' %}",
    "{% else %}",
    "{% endif %}",
    "{{ message.content }}",
    "{{ message['role'] | upper }}",
    "<|im_start|>",
    "<|im_end|>\n",
    "{{ '<|start|>' + message.role }}",
    "{%- set x = message.content.strip() -%}",
    "{{ x }}",
];

/// A change to a template's text, at character offsets taken modulo its length.
#[derive(Clone, Debug)]
pub enum Edit {
    /// Remove a span.
    Delete { at: usize, len: usize },
    /// Insert a copy of a span at another place.
    Duplicate { from: usize, len: usize, to: usize },
    /// Insert a hostile fragment.
    Insert { at: usize, fragment: &'static str },
}

/// A template to render: a real one edited, or fragments strung together.
#[derive(Clone, Debug)]
pub enum TemplateMutant {
    /// `fixtures[which]` with the edits applied.
    Edited { which: usize, edits: Vec<Edit> },
    /// Fragments in order.
    Made(Vec<&'static str>),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let one = prop_oneof![
        2 => (any::<usize>(), 1usize..200).prop_map(|(at, len)| Edit::Delete { at, len }),
        1 => (any::<usize>(), 1usize..400, any::<usize>()).prop_map(|(from, len, to)| Edit::Duplicate { from, len, to }),
        3 => (any::<usize>(), prop::sample::select(HOSTILE)).prop_map(|(at, fragment)| Edit::Insert { at, fragment }),
    ];
    vec(one, 1..=3)
}

pub fn template_mutants() -> impl Strategy<Value = TemplateMutant> {
    let fragment = prop_oneof![1 => prop::sample::select(HOSTILE), 2 => prop::sample::select(ORDINARY)];
    prop_oneof![
        3 => (any::<usize>(), edits()).prop_map(|(which, edits)| TemplateMutant::Edited { which, edits }),
        1 => vec(fragment, 1..8).prop_map(TemplateMutant::Made),
    ]
}

/// The real templates, in a fixed order.
pub fn fixture_templates() -> Vec<String> {
    let dir = common::fixtures_dir().join("chat_templates");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
        .collect();
    names.sort();
    names.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect()
}

/// The byte offset of character `at` (modulo the character count, end included).
fn char_offset(s: &str, at: usize) -> usize {
    let n = s.chars().count() + 1;
    s.char_indices().map(|(i, _)| i).chain([s.len()]).nth(at % n).unwrap()
}

/// The template text of a mutant.
pub fn template_text(fixtures: &[String], m: &TemplateMutant) -> String {
    match m {
        TemplateMutant::Made(parts) => parts.concat(),
        TemplateMutant::Edited { which, edits } => {
            let mut s = fixtures[which % fixtures.len()].clone();
            for e in edits {
                match *e {
                    Edit::Delete { at, len } => {
                        let start = char_offset(&s, at);
                        let end = char_offset(&s[start..], len.min(s[start..].chars().count())) + start;
                        s.replace_range(start..end, "");
                    }
                    Edit::Duplicate { from, len, to } => {
                        let start = char_offset(&s, from);
                        let end = char_offset(&s[start..], len.min(s[start..].chars().count())) + start;
                        let span = s[start..end].to_string();
                        let to = char_offset(&s, to);
                        s.insert_str(to, &span);
                    }
                    Edit::Insert { at, fragment } => {
                        let at = char_offset(&s, at);
                        s.insert_str(at, fragment);
                    }
                }
            }
            s
        }
    }
}

/// Message text: ordinary words, template syntax and markers as data, odd Unicode, empty.
fn content() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z ]{0,24}",
        prop::sample::select(vec![
            "",
            "{{ 7 * 7 }}",
            "{% for %}",
            "<|im_end|>",
            "</think>x",
            "é\u{0}\u{202e}😀",
            "\\n"
        ])
        .prop_map(str::to_string),
    ]
}

/// A value of any JSON type, for extra message fields and variables.
fn any_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop::sample::select(vec![0.5, -1e308, 1e-300]).prop_map(Value::from),
        "[a-z{}%]{0,8}".prop_map(Value::from),
        Just(json!([])),
        Just(json!({})),
        Just(json!([{"type": "function", "function": {"name": "f", "arguments": {"a": [1, {"b": null}]}}}])),
        Just(json!([{"function": "not an object"}, 3])),
    ]
}

fn message() -> impl Strategy<Value = ChatMessage> {
    let role = prop::sample::select(vec![Role::System, Role::User, Role::Assistant, Role::Tool]);
    let extra_key = prop::sample::select(vec!["tool_calls", "tool_call_id", "name", "reasoning_content", "thinking"]);
    (role, content(), vec((extra_key, any_json()), 0..3)).prop_map(|(role, content, extra)| {
        let mut m = ChatMessage::new(role, content);
        m.extra = extra.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<Map<_, _>>();
        m
    })
}

/// Messages, whether to add the generation prompt, tools and further variables.
pub fn conversation() -> impl Strategy<Value = (Vec<ChatMessage>, RenderOptions)> {
    let tools = prop::option::of(vec(any_json(), 0..3));
    let var = prop::sample::select(vec!["enable_thinking", "reasoning_effort", "date_string", "messages", "tools"]);
    (vec(message(), 0..6), any::<bool>(), tools, vec((var, any_json()), 0..2)).prop_map(|(msgs, gen, tools, vars)| {
        let variables = vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        (msgs, RenderOptions { add_generation_prompt: gen, tools, variables })
    })
}

/// Compiles and renders; a failure must be a typed chat-template error.
fn render(source: String, messages: Vec<ChatMessage>, options: RenderOptions) -> Outcome {
    let template = ChatTemplate::new(source, Some("<s>".into()), Some("</s>".into())).map_err(|e| e.to_string())?;
    template.render(&messages, &options).map(|_| ()).map_err(|e| {
        let e = e.to_string();
        assert!(e.starts_with("chat template:"), "untyped error {e}");
        e
    })
}

#[test]
fn mutated_and_made_up_templates_render_or_refuse() {
    let fixtures = fixture_templates();
    fuzz("chat_template/render", 128, (template_mutants(), conversation()), |(m, (messages, options))| {
        let source = template_text(&fixtures, &m);
        guarded_within(RENDER_HANG, move || render(source, messages, options))
    });
}

/// The error of rendering `source` over one user message (a rendering fails the test).
fn refusal(source: &str) -> String {
    let source = source.to_string();
    let messages = vec![ChatMessage::new(Role::User, "hi")];
    let outcome = guarded_within(RENDER_HANG, move || render(source, messages, RenderOptions::default()));
    outcome.unwrap_or_else(|e| panic!("{e}")).expect_err("must be refused")
}

#[test]
fn a_template_that_loops_for_ever_runs_out_of_fuel() {
    let e = refusal(ENDLESS_LOOP);
    assert!(e.contains("instructions"), "{e}");
}

#[test]
fn a_macro_that_calls_itself_hits_the_recursion_limit() {
    for source in [SELF_CALLING_MACRO, SELF_CALLING_MACRO_IN_A_LOOP, ENDLESS_RECURSIVE_LOOP] {
        let e = refusal(source);
        assert!(e.contains("recursion"), "{source}: {e}");
    }
}

#[test]
fn a_template_that_writes_gigabytes_is_refused() {
    let e = refusal("{% for i in range(100000) %}{{ 'x' * 1000000 }}{% endfor %}");
    assert!(e.contains("bytes of prompt"), "{e}");
}

#[test]
fn a_long_real_conversation_stays_within_the_fuel() {
    // 2000 turns through the heaviest fixture template (gpt-oss), with tools.
    let fixtures = fixture_templates();
    let source = fixtures.iter().find(|t| t.contains("<|start|>")).expect("the gpt-oss template").clone();
    let messages: Vec<ChatMessage> = (0..2000)
        .map(|i| ChatMessage::new(if i % 2 == 0 { Role::User } else { Role::Assistant }, format!("turn {i}")))
        .collect();
    let tool = json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    let options = RenderOptions { add_generation_prompt: true, tools: Some(vec![tool]), ..RenderOptions::default() };
    let outcome = guarded_within(RENDER_HANG, move || render(source, messages, options)).unwrap();
    outcome.unwrap();
}

// Regression cases: templates that aborted the process.

#[test]
fn regression_tojson_huge_indent_aborted() {
    // `tojson(indent=10^12)`: a terabyte of spaces allocated per line, the process aborted.
    let e = refusal("{{ messages | tojson(indent=1000000000000) }}");
    assert!(e.contains("indent 1000000000000 is over 64"), "{e}");
}

#[test]
fn regression_huge_format_and_indent_widths_aborted() {
    // minijinja pads with `" ".repeat(width)`: widths of 10^12 aborted the process.
    for source in [
        "{{ '{:>1000000000000}'.format(1) }}",
        "{{ '%999999999999d' | format(1) }}",
        "{{ 'x' | indent(1000000000000) }}",
    ] {
        let e = refusal(source);
        assert!(e.contains("is over 4096"), "{source}: {e}");
    }
}
