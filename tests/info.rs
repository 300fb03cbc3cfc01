//! `moestream info` prints the KV-cache bytes per token: for MLA the latent
//! (`kv_lora_rank + qk_rope_head_dim` f32 values per layer), for grouped attention every key and
//! value head.

use std::path::Path;

fn info(fixture: &str) -> serde_json::Value {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(fixture);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_moestream"))
        .args(["info", "--model", dir.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "info failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn kv_bytes_per_token_by_attention_kind() {
    // DeepSeek fixtures: kv_lora_rank 32 + qk_rope_head_dim 8, f32, 3 layers.
    for fixture in ["deepseek_v2", "deepseek_v3"] {
        let v = info(fixture);
        assert_eq!(v["kv_bytes_per_token"], (32 + 8) * 4 * 3, "{fixture}");
        assert!(v["kv_cache"].as_str().unwrap().starts_with("MLA latent"), "{fixture}");
    }
    // GLM-4.5 fixture: grouped, 2 KV heads of 16, keys and values, f32, 3 layers.
    assert_eq!(info("glm4_moe")["kv_bytes_per_token"], 2 * 2 * 16 * 4 * 3);
}
