//! `moestream prerouter eval` on the bundled model: its shipped heads, scored on held-out text,
//! beat both baselines in every layer; the collected routing is kept only when asked; a missing
//! heads file is named.

use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn moestream(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moestream")).args(args).output().unwrap()
}

#[test]
fn shipped_heads_beat_the_baselines_on_held_out_text() {
    let text = root().join("models/moestream-tiny-moe/validation.txt");
    let data = std::env::temp_dir().join(format!("moestream-eval-test-{}", std::process::id()));
    let out = moestream(&[
        "prerouter",
        "eval",
        "--file",
        text.to_str().unwrap(),
        "--max-tokens",
        "600",
        "--data",
        data.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((r["tokens"].as_u64(), r["top_k"].as_u64()), (Some(600), Some(4)));
    let layers = r["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 7);
    for l in layers {
        let (head, persist, router) = (
            l["head"]["recall"].as_f64().unwrap(),
            l["persistence"]["recall"].as_f64().unwrap(),
            l["router"]["recall"].as_f64().unwrap(),
        );
        assert!(head > persist && head > router && l["recall_2k"].as_f64().unwrap() > head, "{l}");
        assert!(l["samples"].as_u64().unwrap() > 590, "{l}");
    }
    assert!(r["mean_recall"].as_f64().unwrap() > 0.5, "{r}");
    // `--data` keeps the dataset `prerouter train` reads.
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(data.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["tokens"].as_u64(), Some(600));
    std::fs::remove_dir_all(&data).unwrap();

    let out = moestream(&[
        "prerouter",
        "eval",
        "--file",
        text.to_str().unwrap(),
        "--prerouter",
        "/nonexistent/heads.safetensors",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("/nonexistent/heads.safetensors"), "{err}");
}
