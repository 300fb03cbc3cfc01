//! Sliding-window rings: a windowed layer keeps `window + max_batch - 1` positions, not the
//! context. Against transformers' goldens with steps small enough that the rings wrap dozens
//! of times over the 1100-token prompt (gpt-oss: alternating windows with sinks; Mixtral: every
//! layer windowed; Qwen2: mixed); bit for bit equal to keeping every position (`--swa-full`);
//! the cache is as small as the formula says; batched sequences wrap their own rings; a session
//! rolled back within the ring resumes where it is, one rolled back further recomputes from 0
//! (and equals a fresh run), and a step that needs overwritten keys is refused.

mod common;

use common::{assert_bits_eq, fixtures_dir, gpu, max_abs_diff, Golden};
use moestream::decoder::{BatchEntry, Rows, StepOutput};
use moestream::experts::policy::Phase;
use moestream::model::{ArchSpec, CacheShape};
use moestream::ops::{KvDtype, WeightFormat};
use moestream::runtime::sampler::argmax;
use moestream::runtime::{Engine, EngineOptions, GenerateOptions};

const WINDOWED: [&str; 3] = ["gpt_oss", "mixtral_swa", "qwen2_swa"];

fn engine(fixture: &str, max_batch: usize, rings: bool) -> Engine {
    let mut o = EngineOptions::new(fixtures_dir().join(fixture)).with_format(WeightFormat::F32);
    o.context = Some(1200);
    o.kv_dtype = KvDtype::F32;
    o.max_batch = max_batch;
    o.window_rings = rings;
    Engine::load_on(gpu(), &o).unwrap_or_else(|e| panic!("{fixture}: {e}"))
}

fn golden(fixture: &str) -> Golden {
    serde_json::from_str(&std::fs::read_to_string(fixtures_dir().join(fixture).join("golden.json")).unwrap()).unwrap()
}

/// The fixture's 1100-token golden prompt.
fn long_prompt(fixture: &str) -> Vec<u32> {
    golden(fixture).prompts.into_iter().find(|p| p.name == "long").unwrap().tokens
}

fn greedy(n: usize) -> GenerateOptions {
    GenerateOptions { max_tokens: n, ignore_eos: true, ..Default::default() }
}

#[test]
fn wrapped_rings_match_transformers() {
    for fixture in WINDOWED {
        let g = golden(fixture);
        // Steps of 5: rings of window + 4 positions, written over every few steps.
        let e = engine(fixture, 5, true);
        for p in g.prompts.iter().filter(|p| p.tokens.len() > 1) {
            let s = e.score(&p.tokens).unwrap();
            let err = max_abs_diff(&s.logprobs, &p.logprobs);
            println!("{fixture} {}: {} tokens in steps of 5, max |Δ logprob| = {err:.2e}", p.name, p.tokens.len());
            assert!(err < 1e-3, "{fixture} {}: log-prob error {err}", p.name);
            let out = e.generate(&p.tokens, &greedy(p.greedy.len()), |_, _| true).unwrap();
            assert_eq!(out.tokens, p.greedy, "{fixture} {}: greedy tokens", p.name);
        }
    }
}

#[test]
fn rings_equal_every_position_kept_bit_for_bit() {
    for fixture in WINDOWED {
        let long = long_prompt(fixture)[..300].to_vec();
        let ring = engine(fixture, 7, true).score(&long).unwrap().logprobs;
        let full = engine(fixture, 7, false).score(&long).unwrap().logprobs;
        assert_bits_eq(&format!("{fixture}: rings vs --swa-full"), &ring, &full);
    }
}

#[test]
fn caches_are_as_small_as_the_rings() {
    for fixture in WINDOWED {
        let spec = ArchSpec::from_dir(&fixtures_dir().join(fixture)).unwrap();
        let row = spec.kv_row_bytes(KvDtype::F32);
        let cached = (0..spec.layers).filter(|&i| !spec.is_linear_layer(i));
        let want: u64 = cached.map(|i| row * spec.window(i).map_or(1200, |w| (w + 63) as u64).min(1200)).sum();
        let ring = engine(fixture, 64, true);
        let full = engine(fixture, 64, false);
        let (ring_bytes, full_bytes) =
            (ring.new_session().unwrap().cache_bytes(), full.new_session().unwrap().cache_bytes());
        assert_eq!(ring_bytes, want, "{fixture}: ring cache bytes");
        assert_eq!(full_bytes, row * 1200 * spec.layers as u64, "{fixture}: --swa-full cache bytes");
        let shape = CacheShape { context: 1200, max_step: 64, rings: true, state_copy: false };
        assert_eq!(spec.kv_cache_bytes(shape, KvDtype::F32), ring_bytes, "{fixture}: the plan's figure");
        println!("{fixture}: {ring_bytes} bytes with rings, {full_bytes} keeping every position");
    }
    // gpt-oss: half the layers windowed, so about half the cache at this context.
    let spec = ArchSpec::from_dir(&fixtures_dir().join("gpt_oss")).unwrap();
    let shape = CacheShape { context: 32768, max_step: 64, rings: true, state_copy: false };
    let ratio = spec.kv_cache_bytes(shape, KvDtype::F16) as f64
        / spec.kv_cache_bytes(CacheShape { rings: false, ..shape }, KvDtype::F16) as f64;
    assert!(ratio <= 0.55, "gpt-oss at 32K: rings take {ratio:.3} of every position");
}

#[test]
fn batched_sequences_wrap_their_own_rings() {
    let fixture = "gpt_oss";
    let e = engine(fixture, 8, true);
    let m = e.model();
    let long = long_prompt(fixture);
    let prompts = [&long[..40], &long[100..130]];
    let steps = 30;
    // Alone: prefill in chunks of 8, then greedy decode.
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let out = e.generate(p, &greedy(steps), |_, _| true).unwrap();
            out.tokens
        })
        .collect();
    // Together: each prefilled alone, then one batched decode step for both per token.
    let caches: Vec<_> = prompts.iter().map(|_| m.new_cache().unwrap()).collect();
    let mut last = Vec::new();
    for (p, c) in prompts.iter().zip(&caches) {
        let mut logits = Vec::new();
        for (i, chunk) in p.chunks(8).enumerate() {
            let out = m.step(c, chunk, i * 8, Phase::Prefill, StepOutput::Logits).unwrap();
            logits = out.into_logits().unwrap();
        }
        last.push(argmax(&logits));
    }
    let mut got: Vec<Vec<u32>> = last.iter().map(|&t| vec![t]).collect();
    for s in 0..steps - 1 {
        let tokens: Vec<[u32; 1]> = got.iter().map(|g| [*g.last().unwrap()]).collect();
        let entries: Vec<BatchEntry> = caches
            .iter()
            .zip(&tokens)
            .zip(&prompts)
            .map(|((cache, t), p)| BatchEntry { cache, tokens: t, pos: p.len() + s, logits: Rows::Last })
            .collect();
        let rows = m.step_batch(&entries, Phase::Decode).unwrap();
        for (g, r) in got.iter_mut().zip(rows) {
            g.push(argmax(&r[0]));
        }
    }
    assert_eq!(got, solo, "batched decode past the rings vs each sequence alone");
}

#[test]
fn rollbacks_within_the_ring_resume_and_further_ones_recompute() {
    for rings in [true, false] {
        let e = engine("mixtral_swa", 64, rings);
        let long = &long_prompt("mixtral_swa")[..200];
        let mut s = e.new_session().unwrap();
        e.generate_in(&mut s, long, &greedy(4), |_, _| true).unwrap();
        // Back 10 positions (within the 79-position ring): resumes there.
        let at = s.len() - 10;
        s.truncate(at);
        let near = e.generate_in(&mut s, &[], &greedy(6), |_, _| true).unwrap();
        assert_eq!(near.stats.reused_tokens, at - 1, "rings {rings}: a rollback within the ring");
        // Back 120 positions: the ring has written over the window before it.
        s.truncate(100);
        let far = e.generate_in(&mut s, &[], &greedy(6), |_, _| true).unwrap();
        let want = if rings { 0 } else { 99 };
        assert_eq!(far.stats.reused_tokens, want, "rings {rings}: a rollback past the ring");
        let fresh = e.generate(&long[..100], &greedy(6), |_, _| true).unwrap();
        assert_eq!(far.tokens, fresh.tokens, "rings {rings}: tokens after the rollback vs a fresh run");
    }
}

#[test]
fn a_step_needing_overwritten_keys_is_refused() {
    let e = engine("mixtral_swa", 8, true);
    let m = e.model();
    let long = long_prompt("mixtral_swa");
    let cache = m.new_cache().unwrap();
    for (i, chunk) in long[..64].chunks(8).enumerate() {
        m.step(&cache, chunk, i * 8, Phase::Prefill, StepOutput::None).unwrap();
    }
    // The ring keeps 16 + 7 positions: 41..64. A step at 50 needs 35..50.
    let err = m.step(&cache, &long[50..51], 50, Phase::Decode, StepOutput::Logits).unwrap_err();
    assert!(err.to_string().contains("sliding-window ring"), "{err}");
    // Within it (needs 48..60) it runs, and so does starting again at 0.
    m.step(&cache, &long[60..61], 60, Phase::Decode, StepOutput::Logits).unwrap();
    m.step(&cache, &long[..8], 0, Phase::Prefill, StepOutput::None).unwrap();
}

#[test]
fn bench_kv_size_reports_what_a_session_allocates() {
    // The same GGUF file llama.cpp would load: its metadata only.
    let gguf = fixtures_dir().join("gguf/gpt_oss-mxfp4.gguf");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_moestream"))
        .args(["bench", "kv-size", "-m", gguf.to_str().unwrap(), "--contexts", "1200", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let total = |dtype: &str, rings: bool| {
        let row = rows.iter().find(|r| r["dtype"] == dtype && r["rings"] == rings).unwrap();
        row["total_bytes"].as_u64().unwrap()
    };
    // A context of its own: other tests of this binary allocate on the shared one meanwhile.
    let own = moestream::gpu::Gpu::new(&Default::default()).unwrap();
    for (dtype, kv) in [("f16", KvDtype::F16), ("q8_0", KvDtype::Q8_0), ("q4_0", KvDtype::Q4_0)] {
        for rings in [true, false] {
            let mut o = EngineOptions::new(&gguf);
            o.context = Some(1200);
            o.kv_dtype = kv;
            o.window_rings = rings;
            let e = Engine::load_on(own.clone(), &o).unwrap();
            let before = e.gpu().bytes_allocated();
            let session = e.new_session().unwrap();
            // What the session holds: the formula's bytes, each buffer padded to 16 bytes.
            let held = session.cache_bytes();
            assert_eq!(e.gpu().bytes_allocated() - before, held, "{dtype}, rings {rings}: allocated");
            let buffers = 2 * e.spec().layers as u64;
            assert!((0..16 * buffers).contains(&(held - total(dtype, rings))), "{dtype}, rings {rings}: {held}");
        }
    }
    assert!(total("q4_0", true) < total("q8_0", true));
    assert!(total("q8_0", true) < total("f16", true) && total("f16", true) < total("f16", false));
}
