//! Helpers shared by the integration tests: fixture discovery and golden-file parsing.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use moestream::gpu::{Gpu, GpuOptions};

/// One recorded prompt of a golden file.
#[derive(serde::Deserialize, Clone, Debug)]
pub struct GoldenPrompt {
    pub name: String,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub last_logprobs: Vec<f32>,
    pub greedy: Vec<u32>,
    #[serde(default)]
    pub text: Option<String>,
}

/// A fixture's golden.json.
#[derive(serde::Deserialize, Clone, Debug)]
pub struct Golden {
    pub architecture: String,
    pub prompts: Vec<GoldenPrompt>,
}

/// The fixtures directory.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Every fixture directory with a golden.json, sorted.
pub fn fixtures() -> Vec<(PathBuf, Golden)> {
    let mut out: Vec<(PathBuf, Golden)> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("golden.json").exists())
        .map(|p| {
            let g = serde_json::from_str(&std::fs::read_to_string(p.join("golden.json")).unwrap())
                .unwrap();
            (p, g)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no fixtures found");
    out
}

/// The GPU used by tests (lavapipe in CI), opened once per test binary.
pub fn gpu() -> std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    GPU.get_or_init(|| {
        Gpu::new(&GpuOptions::default()).expect("a Vulkan adapter (lavapipe) is required")
    })
    .clone()
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
