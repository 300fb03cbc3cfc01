//! Golden test of the CPU reference forward pass against Hugging Face transformers.
//!
//! For every `tests/fixtures/<name>/golden.json` (written by `tests/fixtures/make_golden.py`),
//! the reference model must reproduce transformers' per-position log-probs and last-position
//! log-probs within 1e-3 and its greedy continuation exactly.

use std::path::{Path, PathBuf};

use moestream::reference::ops::log_softmax;
use moestream::reference::ReferenceModel;
use serde_json::Value;

const TOL: f32 = 1e-3;

struct Prompt {
    name: String,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    last_logprobs: Vec<f32>,
    greedy: Vec<u32>,
}

fn floats(v: &Value, key: &str) -> Vec<f32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("golden: `{key}` missing"))
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn ids(v: &Value, key: &str) -> Vec<u32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("golden: `{key}` missing"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn read_golden(path: &Path) -> (String, Vec<Prompt>) {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let arch = v["architecture"].as_str().unwrap_or("?").to_string();
    let prompts = v["prompts"]
        .as_array()
        .expect("golden: prompts")
        .iter()
        .map(|p| Prompt {
            name: p["name"].as_str().unwrap_or("?").to_string(),
            tokens: ids(p, "tokens"),
            logprobs: floats(p, "logprobs"),
            last_logprobs: floats(p, "last_logprobs"),
            greedy: ids(p, "greedy"),
        })
        .collect();
    (arch, prompts)
}

fn fixture_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.join("golden.json").is_file()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Checks one fixture; returns a description of every failure (empty when it passes).
fn check_fixture(dir: &Path) -> Vec<String> {
    let (arch, prompts) = read_golden(&dir.join("golden.json"));
    let name = dir.file_name().unwrap().to_string_lossy().to_string();
    let model = match ReferenceModel::load(dir) {
        Ok(m) => m,
        Err(e) => return vec![format!("{name}: load failed: {e}")],
    };
    assert_eq!(model.spec().family.hf_name(), arch, "{name}: architecture");
    let mut failures = Vec::new();
    let (mut worst_lp, mut worst_last) = (0.0f32, 0.0f32);
    for p in &prompts {
        let logits = model.forward(&p.tokens).unwrap();
        let lp: Vec<f32> = logits.iter().zip(&p.tokens[1..]).map(|(l, &next)| log_softmax(l)[next as usize]).collect();
        let last = log_softmax(logits.last().unwrap());
        let (e_lp, e_last) = (max_abs_diff(&lp, &p.logprobs), max_abs_diff(&last, &p.last_logprobs));
        worst_lp = worst_lp.max(e_lp);
        worst_last = worst_last.max(e_last);
        if e_lp > TOL || e_lp.is_nan() {
            failures.push(format!("{name}/{}: logprobs max abs error {e_lp:.3e} > {TOL:e}", p.name));
        }
        if e_last > TOL || e_last.is_nan() {
            failures.push(format!("{name}/{}: last_logprobs max abs error {e_last:.3e} > {TOL:e}", p.name));
        }
        let greedy = model.greedy(&p.tokens, p.greedy.len()).unwrap();
        if greedy != p.greedy {
            failures.push(format!("{name}/{}: greedy {greedy:?} != golden {:?}", p.name, p.greedy));
        }
    }
    println!(
        "{name} ({arch}): {} prompts, max abs error logprobs {worst_lp:.3e}, last_logprobs {worst_last:.3e}",
        prompts.len()
    );
    failures
}

#[test]
fn reference_matches_transformers_golden() {
    let dirs = fixture_dirs();
    assert!(!dirs.is_empty(), "no tests/fixtures/*/golden.json found");
    // One thread per fixture: they are independent and the long prompt dominates.
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = dirs.iter().map(|d| s.spawn(move || check_fixture(d))).collect();
        handles.into_iter().flat_map(|h| h.join().expect("fixture thread panicked")).collect()
    });
    assert!(failures.is_empty(), "golden mismatches:\n{}", failures.join("\n"));
}

#[test]
fn log_probs_and_forward_agree() {
    let Some(dir) = fixture_dirs().into_iter().next() else {
        return;
    };
    let model = ReferenceModel::load(&dir).unwrap();
    let tokens = [1u32, 5, 9, 2, 7];
    let logits = model.forward(&tokens).unwrap();
    assert_eq!(logits.len(), tokens.len());
    let lp = model.log_probs(&tokens).unwrap();
    assert_eq!(lp.len(), tokens.len() - 1);
    for (i, &v) in lp.iter().enumerate() {
        assert_eq!(v, log_softmax(&logits[i])[tokens[i + 1] as usize]);
    }
    // A session stepping token by token sees the same logits as forward.
    let mut s = model.session();
    for (i, &t) in tokens.iter().enumerate() {
        assert_eq!(s.step(t).unwrap(), logits[i]);
    }
    assert_eq!(s.position(), tokens.len());
}
