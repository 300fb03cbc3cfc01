//! Guards on what a user feels on the default path, none of them timing-dependent:
//! - no pipeline, shader module, bind group or buffer is created after the first decode step
//!   (resident and streamed, the bundled model and one fixture of each attention kind);
//! - memory stays flat as tokens are generated: a child process generates N tokens, then 10·N,
//!   and its resident set and GPU bytes after the longer run may exceed those after the shorter
//!   by a small fixed allowance only (a driver that compiles a shader per dispatch, as lavapipe
//!   did for norm_router, grew by ~10 MiB a token).

mod common;

use std::path::PathBuf;

use common::child::run_child_test;

use moestream::ops::KvDtype;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions, MtpLoad};
use moestream::util::peak_rss::{current_rss_bytes, peak_rss_bytes};

/// Tokens of the shorter run; the longer one generates ten times as many.
const SHORT: usize = 12;
/// Resident-set growth from the shorter run to the longer one that is not taken for a leak:
/// allocator slack and the few KV-cache pages the extra positions touch (lavapipe's buffers
/// are host memory). The norm_router leak grew this much in about three tokens.
const RSS_ALLOWANCE: u64 = 24 << 20;
/// Environment variable that makes `memory_stays_flat_as_tokens_are_generated` the child run
/// for one model (its value, a key of [`models`]).
const CHILD: &str = "MOESTREAM_GUARD_CHILD";

/// The models the guards run: the bundled one (the README's first command, resident and
/// streamed at half its experts) and one fixture of each attention kind.
fn models() -> Vec<(&'static str, EngineOptions)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bundled = root.join("models/moestream-tiny-moe");
    let fixture = |name: &str| EngineOptions::new(root.join("tests/fixtures").join(name));
    let mut streamed = EngineOptions::new(&bundled);
    streamed.budget = ExpertBudget::Slots(8 * 32 / 2);
    vec![
        ("bundled", EngineOptions::new(&bundled)),
        ("bundled-streamed", streamed),
        ("grouped", fixture("qwen3_moe")),
        ("mla", fixture("deepseek_v3")),
        ("linear", fixture("qwen3_next")),
        ("sliding-window", fixture("gpt_oss")),
        // Rings written over and q8_0 rows quantized every step.
        ("sliding-window-q8", EngineOptions { kv_dtype: KvDtype::Q8_0, max_batch: 4, ..fixture("gpt_oss") }),
        // Drafts from an MTP module (verify steps of several tokens, MTP steps of several rows).
        ("mtp", EngineOptions { mtp: MtpLoad::Required, ..fixture("glm4_moe") }),
    ]
}

/// Generates `max_tokens` after a fixed prompt, with MTP drafts where the engine has the module.
fn generate(engine: &Engine, max_tokens: usize, mut each: impl FnMut(usize)) {
    let mtp_drafts = if engine.model().has_mtp() { 3 } else { 0 };
    let options = GenerateOptions { max_tokens, ignore_eos: true, mtp_drafts, ..Default::default() };
    let mut n = 0;
    let g = engine
        .generate(&[1, 2, 3], &options, |_, _| {
            n += 1;
            each(n);
            true
        })
        .unwrap();
    assert_eq!(g.tokens.len(), max_tokens);
}

#[test]
fn no_gpu_object_is_created_after_the_first_decode_step() {
    for (name, options) in models() {
        // A context of its own: other tests in this process create objects on theirs.
        let engine = Engine::load(&options).unwrap();
        let gpu = engine.gpu().clone();
        // Token 1 comes from the prefill, token 2 from the first decode step.
        let mut after_first_step = None;
        generate(&engine, 4 * SHORT, |n| {
            if n == 2 {
                after_first_step = Some(gpu.objects_created());
            }
        });
        let (before, after) = (after_first_step.unwrap(), gpu.objects_created());
        assert!(
            before.pipelines > 0 && before.bind_groups > 0 && before.buffers > 0,
            "{name}: not counted: {before:?}"
        );
        assert_eq!(before, after, "{name}: objects created by decode steps after the first");
        // A second request on the same engine (a new prefill) creates none either.
        generate(&engine, SHORT, |_| ());
        assert_eq!(after, gpu.objects_created(), "{name}: objects created by a second request");
    }
}

#[test]
#[cfg(target_os = "linux")]
fn memory_stays_flat_as_tokens_are_generated() {
    if let Ok(model) = std::env::var(CHILD) {
        // The child: one model, the shorter run then the longer one, figures on stdout.
        let (_, options) = models().into_iter().find(|(n, _)| *n == model).unwrap();
        let engine = Engine::load(&options).unwrap();
        let mut figures = Vec::new();
        for tokens in [SHORT, 10 * SHORT] {
            generate(&engine, tokens, |_| ());
            figures.push((current_rss_bytes(), peak_rss_bytes(), engine.gpu().bytes_allocated()));
        }
        let [(rss_a, peak_a, gpu_a), (rss_b, peak_b, gpu_b)] = figures[..] else { unreachable!() };
        println!("GUARD {rss_a} {peak_a} {gpu_a} {rss_b} {peak_b} {gpu_b}");
        return;
    }
    for (name, _) in models() {
        let stdout = run_child_test("memory_stays_flat_as_tokens_are_generated", name, &[(CHILD, name.as_ref())]);
        let line = stdout.lines().find_map(|l| l.split_once("GUARD ")).unwrap_or_else(|| panic!("{stdout}")).1;
        let v: Vec<u64> = line.split_whitespace().take(6).map(|x| x.parse().unwrap()).collect();
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        println!(
            "{name}: {SHORT} tokens: RSS {:.1} MiB (peak {:.1}), GPU {:.1} MiB; {} tokens: RSS {:.1} MiB (peak {:.1}), GPU {:.1} MiB",
            mib(v[0]),
            mib(v[1]),
            mib(v[2]),
            10 * SHORT,
            mib(v[3]),
            mib(v[4]),
            mib(v[5])
        );
        assert!(v[3] <= v[0] + RSS_ALLOWANCE, "{name}: RSS grew {:.1} MiB over {} tokens", mib(v[3] - v[0]), 9 * SHORT);
        assert!(v[4] <= v[1] + RSS_ALLOWANCE, "{name}: peak RSS grew {:.1} MiB", mib(v[4] - v[1]));
        assert_eq!(v[5], v[2], "{name}: GPU bytes allocated changed with the tokens generated");
    }
}
