//! Multi-token-prediction modules (DeepSeek-V3, GLM-4.5): the CPU reference against the torch
//! reference in `tests/fixtures/make_mtp.py` (`mtp_golden.json`), the GPU module against the CPU
//! reference, and speculative decoding with MTP drafts giving the plain tokens.

mod common;

use std::path::{Path, PathBuf};

use moestream::reference::ops::{argmax, log_softmax};
use moestream::reference::{ReferenceModel, ReferenceMtp};
use serde_json::Value;

/// The fixtures that ship an MTP layer.
const MTP_FIXTURES: [&str; 2] = ["deepseek_v3", "glm4_moe"];

fn fixture(name: &str) -> PathBuf {
    common::fixtures_dir().join(name)
}

/// A golden sequence: its tokens, the torch MTP's log-prob of `t[i+2]` at every `i < n - 2`, its
/// greedy draft at every `i < n - 1` and its log-probs at the last.
struct MtpGolden {
    name: String,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    drafts: Vec<u32>,
    last_logprobs: Vec<f32>,
}

fn goldens(dir: &Path) -> Vec<MtpGolden> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("mtp_golden.json")).unwrap()).unwrap();
    let floats = |s: &Value, k: &str| s[k].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let ids = |s: &Value, k: &str| s[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    v["sequences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| MtpGolden {
            name: s["name"].as_str().unwrap().to_string(),
            tokens: ids(s, "tokens"),
            logprobs: floats(s, "logprobs"),
            drafts: ids(s, "drafts"),
            last_logprobs: floats(s, "last_logprobs"),
        })
        .collect()
}

/// The CPU reference's MTP log-softmax at every position `i < n - 1` of `tokens`.
fn reference_mtp(model: &ReferenceModel, mtp: &ReferenceMtp, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut main = model.session();
    let mut head = mtp.session(model);
    (0..tokens.len() - 1)
        .map(|i| {
            main.step(tokens[i]).unwrap();
            log_softmax(&head.step(main.hidden(), tokens[i + 1]).unwrap())
        })
        .collect()
}

#[test]
fn the_cpu_reference_mtp_matches_torch() {
    for name in MTP_FIXTURES {
        let dir = fixture(name);
        let model = ReferenceModel::load(&dir).unwrap();
        let mtp = ReferenceMtp::load(&dir, &model).unwrap();
        for g in goldens(&dir) {
            let lsm = reference_mtp(&model, &mtp, &g.tokens);
            let n = g.tokens.len();
            let got: Vec<f32> = (0..n - 2).map(|i| lsm[i][g.tokens[i + 2] as usize]).collect();
            let what = format!("{name} {}", g.name);
            assert!(common::max_abs_diff(&got, &g.logprobs) < 1e-3, "{what}: log-probs {got:?} vs {:?}", g.logprobs);
            assert!(common::max_abs_diff(&lsm[n - 2], &g.last_logprobs) < 1e-3, "{what}: last log-probs");
            let drafts: Vec<u32> = lsm.iter().map(|l| argmax(l) as u32).collect();
            assert_eq!(drafts, g.drafts, "{what}: drafts");
        }
    }
}

#[test]
fn models_without_a_runnable_mtp_layer_are_refused_by_name() {
    // The Qwen3-Next fixture declares none; a DeepSeek-V2 fixture neither.
    for (name, says) in [("qwen3_next", "no MTP layers"), ("deepseek_v2", "no MTP layers")] {
        let model = ReferenceModel::load(&fixture(name)).unwrap();
        let err = ReferenceMtp::load(&fixture(name), &model).err().expect("refused").to_string();
        assert!(err.contains(says), "{name}: {err}");
    }
}
