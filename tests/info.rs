//! `moestream info` prints the KV-cache bytes per token: for MLA the latent
//! (`kv_lora_rank + qk_rope_head_dim` f32 values per layer), for grouped attention every key and
//! value head (in the `--kv-dtype`, f16 by default, or f32); each layer's sliding window; MXFP4 experts as stored;
//! a hybrid model's linear-attention layers and their fixed per-sequence state; the MTP layers a
//! checkpoint ships.

use std::path::Path;

use moestream::ops::KvDtype;

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
    // DeepSeek fixtures: kv_lora_rank 32 + qk_rope_head_dim 8, 3 layers; the latent cache
    // follows --kv-dtype.
    // Decompressed: 4 heads x (24 K + 16 V) on V2, x (24 K + 24 V) on V3.
    for (fixture, decompressed) in [("deepseek_v2", 4 * (24 + 16) * 2 * 3), ("deepseek_v3", 4 * (24 + 24) * 2 * 3)] {
        let v = info(fixture);
        assert_eq!(v["kv_bytes_per_token_f32"], (32 + 8) * 4 * 3, "{fixture}");
        assert_eq!(v["kv_bytes_per_token_f16"], (32 + 8) * 2 * 3, "{fixture}");
        assert!(v["kv_cache"].as_str().unwrap().starts_with("MLA latent"), "{fixture}");
        assert_eq!(v["kv_bytes_per_token_decompressed_f16"], decompressed, "{fixture}");
        // The latent (32) and rotary key (8) rows in q4_0: half a byte a value, a scale word each.
        assert_eq!(v["kv_bytes_per_token_q4_0"], (16 + 4 + 4 + 4) * 3, "{fixture}");
    }
    // GLM-4.5 fixture: grouped, 2 KV heads of 16, keys and values, f32, 3 layers.
    let glm = info("glm4_moe");
    assert_eq!(glm["kv_bytes_per_token_f32"], 2 * 2 * 16 * 4 * 3);
    assert_eq!(glm["kv_bytes_per_token_f16"], 2 * 2 * 16 * 2 * 3);
    assert!(glm["kv_bytes_per_token_decompressed_f16"].is_null());
    // q4_0: rows of 16 in two blocks of 8, their codes in 8 bytes and their scales in a word.
    assert_eq!(glm["kv_bytes_per_token_q4_0"], 2 * 2 * (8 + 4) * 3);
}

#[test]
fn multi_token_prediction_layers_are_reported() {
    // DeepSeek-V3's, GLM-4.5's, Qwen3-Next's, Qwen3.5-MoE's and Ling's fixtures ship one MTP ("nextn")
    // layer; Mixtral's none.
    for (fixture, mtp) in
        [("deepseek_v3", 1), ("glm4_moe", 1), ("qwen3_next", 1), ("qwen3_5_moe", 1), ("ling", 1), ("mixtral", 0)]
    {
        assert_eq!(info(fixture)["mtp_layers"], mtp, "{fixture}");
        // The fixtures ship their MTP layer's weights, which run.
        assert_eq!(info(fixture)["mtp_runs"], mtp == 1, "{fixture}");
    }
    // A GGUF file's `nextn_predict_layers` and `blk.3.nextn.*` tensors (the GLM-4.5 fixture's,
    // as llama.cpp converts it).
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf/glm4_moe-bf16.gguf");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_moestream"))
        .args(["info", "--model", gguf.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mtp_layers"], 1);
    assert_eq!(v["mtp_runs"], true, "the GGUF file's MTP layer runs");
}

#[test]
fn sliding_windows_per_layer() {
    // Qwen2's rule without layer_types: layers from max_window_layers (1) on; Mixtral: all.
    assert_eq!(info("qwen2_swa")["spec"]["layer_windows"], serde_json::json!([null, 12, 12]));
    assert_eq!(info("mixtral_swa")["spec"]["layer_windows"], serde_json::json!([16, 16]));
    assert!(info("mixtral")["spec"].get("layer_windows").is_none(), "no windows, no field");
}

/// DeepSeek-V2-Lite's hub config (transformers-4 layout, YaRN to 160K) parses, and its latent
/// cache is 9x smaller than decompressed keys and values would be.
#[test]
fn deepseek_v2_lite_hub_config_and_its_kv_figure() {
    let cfg = serde_json::json!({
        "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "aux_loss_alpha": 0.001,
        "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
        "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512, "max_position_embeddings": 163840,
        "model_type": "deepseek_v2", "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1,
        "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
        "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16, "q_lora_rank": null,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-6,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": true,
        "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
        "v_head_dim": 128, "vocab_size": 102400
    });
    let spec = moestream::model::ArchSpec::from_config(&cfg).unwrap();
    let m = spec.mla().unwrap();
    assert_eq!(spec.kv_bytes_per_token(KvDtype::F32, true), (512 + 64) * 4 * 27);
    assert_eq!(spec.kv_bytes_per_token(KvDtype::F16, true), (512 + 64) * 2 * 27);
    let decompressed = (16 * (m.qk_head_dim() + m.v_head_dim) * 4 * 27) as u64;
    assert_eq!((spec.kv_bytes_per_token(KvDtype::F32, true), decompressed), (62_208, 552_960));
    // `--mla-cache decompressed` caches exactly that.
    let mut d = spec.clone();
    if let moestream::model::AttentionKind::Mla(m) = &mut d.attention {
        m.cache = moestream::model::MlaCacheKind::Decompressed;
    }
    assert_eq!(d.kv_bytes_per_token(KvDtype::F32, true), 552_960);
    // mscale == mscale_all_dim: the softmax scale is 192^-0.5 times mscale(40, 0.707)^2.
    let mscale = 0.1 * 0.707 * 40f32.ln() + 1.0;
    assert!((m.softmax_scale - mscale * mscale / 192f32.sqrt()).abs() < 1e-6);
    assert_eq!(spec.moe.as_ref().unwrap().shared_expert_intermediate, Some(2 * 1408));
    assert_eq!(spec.moe_layers.iter().filter(|m| !**m).count(), 1);
    // The FP8 DeepSeek-V3 release is refused by name, not misread.
    let mut fp8 = cfg.clone();
    fp8["quantization_config"] = serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128]});
    let e = moestream::model::ArchSpec::from_config(&fp8).unwrap_err();
    assert!(e.to_string().contains("quantization_config (fp8)"), "{e}");
}

#[test]
fn mxfp4_experts_are_counted_as_stored() {
    // 3 projections of 32 x 64 per expert: 6144 weights, 17 bytes per block of 32.
    let v = info("gpt_oss_mxfp4");
    assert_eq!(v["params_per_expert"], 6144);
    assert_eq!(v["bytes_per_expert_mxfp4"], 6144 / 32 * 17);
    assert!(info("gpt_oss")["bytes_per_expert_mxfp4"].is_null(), "a bf16 checkpoint has no MXFP4 figure");
}

#[test]
fn linear_attention_layers_and_their_state() {
    // Qwen3-Next fixture (layer_types: three linear layers, then full attention): per linear layer
    // the conv window (conv_dim = 2 x 2 key heads x 16 + 4 value heads x 16 = 128 channels, 3
    // past inputs) and the recurrent state (4 value heads x 16 x 16), f32.
    let v = info("qwen3_next");
    let per_layer = (128 * 3 + 4 * 16 * 16) * 4;
    assert_eq!(v["linear_attention"]["layers"], 3);
    assert_eq!(v["linear_attention"]["kind"], "Gated DeltaNet");
    assert_eq!(v["linear_attention"]["state_bytes_per_sequence"], 3 * per_layer);
    // Only the full-attention layer has a KV cache: 2 KV heads x 16, keys and values, f16.
    assert_eq!(v["kv_bytes_per_token_f16"], 2 * 2 * 16 * 2);
    assert_eq!(info("ling")["linear_attention"]["kind"], "KDA (Kimi Delta Attention)");
    assert!(info("mixtral")["linear_attention"].is_null(), "no hybrid layers, no field");
}
