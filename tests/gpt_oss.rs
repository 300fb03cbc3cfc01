//! gpt-oss beyond the goldens (engine_golden and streaming_exact cover `gpt_oss/` and
//! `gpt_oss_mxfp4/` against transformers and resident == streamed):
//! - the clamped, biased expert kernels (`CLAMPED`) on f32 and on MXFP4 slots against
//!   `reference::ops::expert_mlp` on the dequantized weights, |Δ| ≤ 1e-4·(1+|ref|);
//! - the MXFP4 checkpoint read losslessly: every expert's slot bytes are the hub blocks
//!   reordered into ggml blocks, and their dequantization equals the documented formula;
//! - the MXFP4 engine equals the CPU reference on the same weights; a decode step over more
//!   than one split (the merge applying the sinks) equals the reference;
//! - `convert`: MXFP4 experts stored unchanged, expert biases resident in f32;
//! - llama.cpp's `gpt-oss` GGUF (its own converter's output) runs as the directory it came from;
//! - malformed configs and checkpoints refused with typed errors.

mod common;

use std::path::Path;

use common::{assert_close, fixtures_dir, gpu, read_f32, submit, upload_f32, upload_u32, Rng, TempDir};
use moestream::convert::{convert, ConvertOptions};
use moestream::error::Error;
use moestream::experts::arena::SlotLayout;
use moestream::experts::{SlotArena, SlotTable};
use moestream::gpu::StepUniform;
use moestream::model::gguf::{dequant, GgmlType};
use moestream::model::{layer_weights, ArchSpec, Checkpoint, ExpertAct};
use moestream::ops::experts::{ExpertFfn, ExpertIo, ExpertPrefill};
use moestream::ops::WeightFormat;
use moestream::reference::ops as refops;
use moestream::runtime::{Engine, EngineOptions};

const ACT: ExpertAct = ExpertAct::ClampedSwiGlu { alpha: 1.702, limit: 1.5 };

/// Random ggml MXFP4 bytes of a `[rows, cols]` matrix (scales 2^-4 .. 2^-2).
fn mxfp4_bytes(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows * cols / 32 {
        out.push(123 + rng.below(3) as u8);
        out.extend((0..16).map(|_| rng.below(256) as u8));
    }
    out
}

/// Runs one layer's clamped expert FFN (every expert resident) for `t` tokens routed to
/// `top_k` experts each, in `format` (f32, or MXFP4 bytes), against the reference.
fn check_clamped_ffn(format: WeightFormat, hidden: usize, inter: usize, t: usize, top_k: usize, seed: u64) {
    let gpu = gpu();
    let n_experts = 5;
    let mut rng = Rng::new(seed);
    let layout = SlotLayout::new(format, hidden, inter).unwrap();
    let arena = SlotArena::new(&gpu, n_experts, layout).unwrap();
    let mut table = SlotTable::new(&gpu, 1, n_experts);
    let mut weights = Vec::new();
    for e in 0..n_experts {
        let (bytes, w) = match format {
            WeightFormat::Ggml(GgmlType::Mxfp4) | WeightFormat::Padded(GgmlType::Mxfp4) => {
                let m = [(inter, hidden), (inter, hidden), (hidden, inter)].map(|(r, c)| mxfp4_bytes(&mut rng, r, c));
                let w = [&m[0], &m[1], &m[2]].map(|b| dequant::dequantize(GgmlType::Mxfp4, b));
                // The file's blocks, padded by the restaging a store's reads do.
                let stored = SlotLayout::new(WeightFormat::Ggml(GgmlType::Mxfp4), hidden, inter).unwrap();
                let mut bytes = stored.place([&m[0], &m[1], &m[2]]);
                if layout != stored {
                    let placed = std::mem::replace(&mut bytes, vec![0u8; layout.slot_bytes]);
                    layout.restage(&stored, &placed, &mut bytes).unwrap();
                }
                (bytes, w)
            }
            _ => {
                let w = [inter * hidden, inter * hidden, hidden * inter].map(|n| rng.vec(n, -0.5, 0.5));
                (layout.encode(&w[0], &w[1], &w[2]).unwrap(), w)
            }
        };
        arena.write(&gpu, e, &bytes);
        table.set(&gpu, 0, e, e as u32);
        weights.push(w);
    }
    let bias = rng.vec(n_experts * (2 * inter + hidden), -1.0, 1.0);
    let x = rng.vec(t * hidden, -1.0, 1.0);
    let mut ids = Vec::new();
    for _ in 0..t {
        let mut all: Vec<u32> = (0..n_experts as u32).collect();
        rng.shuffle(&mut all);
        ids.extend(&all[..top_k]);
    }
    let route_w = rng.vec(t * top_k, 0.05, 1.0);
    let step = StepUniform::new(&gpu);
    step.set(&gpu, t, 0);
    let (xb, ib, wb, bb) =
        (upload_f32(&gpu, &x), upload_u32(&gpu, &ids), upload_f32(&gpu, &route_w), upload_f32(&gpu, &bias));
    let pairs = t * top_k;
    let hb = upload_f32(&gpu, &vec![0.0; pairs * inter]);
    let yb = upload_f32(&gpu, &vec![0.0; pairs * hidden]);
    let io = ExpertIo { x: &xb, ids: &ib, route_w: &wb, h: &hb, y: &yb, act: (ACT, Some(&bb)) };
    let op = ExpertFfn::new(&gpu, &step.buffer, io, arena.binding(&table), &layout, 0, top_k, ExpertPrefill::Pairs);
    submit(&gpu, |pass| op.record(&gpu, pass, t));
    let y = read_f32(&gpu, &yb, pairs * hidden);
    let per = 2 * inter + hidden;
    let mut clamped = 0;
    for j in 0..pairs {
        let e = ids[j] as usize;
        let [g, u, d] = &weights[e];
        let xt = &x[(j / top_k) * hidden..(j / top_k + 1) * hidden];
        let mut want = vec![0.0; hidden];
        refops::expert_mlp((g, u, d), Some(&bias[e * per..(e + 1) * per]), ACT, hidden, inter, xt, &mut want);
        want.iter_mut().for_each(|v| *v *= route_w[j]);
        let what = format!("clamped expert FFN {format:?} H={hidden} I={inter} pair {j} (expert {e})");
        assert_close(&what, &y[j * hidden..(j + 1) * hidden], &want, 1e-4);
        let mut gate = vec![0.0; inter];
        refops::matvec(g, inter, hidden, xt, &mut gate);
        clamped += gate.iter().zip(&bias[e * per..]).filter(|(a, b)| *a + *b > 1.5).count();
    }
    assert!(clamped > 0, "the case must exercise the gate's clamp");
}

#[test]
fn clamped_expert_kernels_match_reference() {
    let mut seed = 1;
    for &(hidden, inter) in &[(64usize, 32usize), (96, 64), (32, 160)] {
        for &(t, k) in &[(1usize, 2usize), (7, 3)] {
            for format in
                [WeightFormat::F32, WeightFormat::Ggml(GgmlType::Mxfp4), WeightFormat::Padded(GgmlType::Mxfp4)]
            {
                seed += 1;
                check_clamped_ffn(format, hidden, inter, t, k, seed);
            }
        }
    }
}

fn fixture(name: &str) -> std::path::PathBuf {
    fixtures_dir().join(name)
}

#[test]
fn mxfp4_experts_are_read_losslessly() {
    const FP4: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
    let dir = fixture("gpt_oss_mxfp4");
    let spec = ArchSpec::from_dir(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let m = spec.moe.as_ref().unwrap();
    let (h, inter, n) = (spec.hidden, m.expert_intermediate, m.num_experts);
    for layer in 0..spec.layers {
        let name = |t: &str| format!("model.layers.{layer}.mlp.experts.{t}");
        for e in 0..n {
            let w = layer_weights::expert(&ck, &spec, layer, e).unwrap();
            // The documented formula on the hub bytes: row r of gate_up is gate row r/2 (even)
            // or up row r/2 (odd); element 2j / 2j+1 of a block in byte j's low / high nibble.
            let hub = |proj: &str, rows: usize, cols: usize| -> Vec<f32> {
                let g = cols / 32;
                let blocks = ck.u8_slab(&name(&format!("{proj}_blocks")), &[n, rows, g, 16], e).unwrap();
                let scales = ck.u8_slab(&name(&format!("{proj}_scales")), &[n, rows, g], e).unwrap();
                (0..rows * cols)
                    .map(|i| {
                        let (r, c) = (i / cols, i % cols);
                        let byte = blocks[(r * g + c / 32) * 16 + (c % 32) / 2];
                        let code = (byte >> (4 * (c % 2))) & 15;
                        FP4[code as usize] * 2f32.powi(scales[r * g + c / 32] as i32 - 127)
                    })
                    .collect()
            };
            let gu = hub("gate_up_proj", 2 * inter, h);
            let rows = |parity: usize| -> Vec<f32> {
                (0..inter).flat_map(|r| gu[(2 * r + parity) * h..(2 * r + parity + 1) * h].to_vec()).collect()
            };
            assert_eq!(w.gate.data, rows(0), "layer {layer} expert {e} gate");
            assert_eq!(w.up.data, rows(1), "layer {layer} expert {e} up");
            assert_eq!(w.down.data, hub("down_proj", h, inter), "layer {layer} expert {e} down");
            for t in [&w.gate, &w.up, &w.down] {
                let g = t.ggml.as_ref().expect("MXFP4 experts keep their bytes");
                assert_eq!(g.ggml_type, GgmlType::Mxfp4);
                assert_eq!(dequant::dequantize(GgmlType::Mxfp4, &g.bytes), t.data);
            }
        }
    }
}

#[test]
fn mxfp4_engine_matches_reference() {
    let dir = fixture("gpt_oss_mxfp4");
    let mut o = EngineOptions::new(&dir).with_format(WeightFormat::F32);
    o.context = Some(256);
    o.kv_dtype = moestream::ops::KvDtype::F32;
    let e = Engine::load_on(gpu(), &o).unwrap();
    assert_eq!(e.expert_slot_layout().unwrap().format, WeightFormat::Padded(GgmlType::Mxfp4));
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    let tokens: Vec<u32> = golden["prompts"][1]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .chain((0..30).map(|i| (i * 7 + 3) % 300))
        .collect();
    let got = e.score(&tokens).unwrap().logprobs;
    let want = moestream::reference::ReferenceModel::load(&dir).unwrap().log_probs(&tokens).unwrap();
    assert_close("MXFP4 engine vs reference (past the 16-key window)", &got, &want, 1e-4);
}

#[test]
fn split_decode_with_sinks_matches_reference() {
    // 299 tokens prefilled, then one decode step over 300 keys: more than one 256-key split, so
    // the split pass and the merge that applies the sinks run (windowed and full layers).
    let dir = fixture("gpt_oss");
    let mut o = EngineOptions::new(&dir).with_format(WeightFormat::F32);
    o.context = Some(320);
    o.kv_dtype = moestream::ops::KvDtype::F32;
    let e = Engine::load_on(gpu(), &o).unwrap();
    let tokens: Vec<u32> = (0..300).map(|i| (i * 37 + 11) % 380).collect();
    let mut s = e.new_session().unwrap();
    e.next_logprobs_in(&mut s, &tokens[..299]).unwrap();
    let got = e.next_logprobs_in(&mut s, &tokens[299..]).unwrap();
    let logits = moestream::reference::ReferenceModel::load(&dir).unwrap().forward(&tokens).unwrap();
    let want = refops::log_softmax(logits.last().unwrap());
    let err = common::max_abs_diff(&got, &want);
    println!("gpt-oss split decode at 300 keys vs reference: max |Δ logprob| = {err:.2e}");
    assert!(err < 1e-3, "split decode with sinks: {err}");
}

/// A copy of the bf16 fixture with `edit` applied to its config.json.
fn edited(tag: &str, edit: impl FnOnce(&mut serde_json::Value)) -> TempDir {
    edited_from("gpt_oss", tag, edit)
}

/// A copy of fixture `name` with `edit` applied to its config.json.
fn edited_from(name: &str, tag: &str, edit: impl FnOnce(&mut serde_json::Value)) -> TempDir {
    let tmp = TempDir::new(tag);
    let src = fixture(name);
    for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    tmp
}

fn load_err(dir: &Path) -> Error {
    let mut o = EngineOptions::new(dir).with_format(WeightFormat::F32);
    o.context = Some(64);
    Engine::load_on(gpu(), &o).err().expect("must be refused")
}

#[test]
fn malformed_configs_are_typed_errors() {
    let unknown_type = edited("gptoss-layer-type", |c| c["layer_types"][1] = "chunked_attention".into());
    let err = load_err(unknown_type.path());
    assert!(matches!(&err, Error::UnsupportedConfig(m) if m.contains("chunked_attention")), "{err}");

    let short_types = edited("gptoss-layer-types", |c| c["layer_types"] = serde_json::json!(["full_attention"]));
    let err = load_err(short_types.path());
    assert!(matches!(&err, Error::ConfigValue { field, .. } if field == "layer_types"), "{err}");

    let int8 = edited("gptoss-quant", |c| c["quantization_config"] = serde_json::json!({"quant_method": "fp8"}));
    let err = load_err(int8.path());
    assert!(matches!(&err, Error::UnsupportedConfig(m) if m.contains("fp8")), "{err}");

    let limit = edited("gptoss-limit", |c| c["swiglu_limit"] = serde_json::json!(-1.0));
    let err = load_err(limit.path());
    assert!(matches!(&err, Error::UnsupportedConfig(m) if m.contains("swiglu_limit")), "{err}");

    // A checkpoint without its attention sinks.
    let no_sinks = edited("gptoss-sinks", |_| {});
    rewrite_without(
        &fixture("gpt_oss").join("model.safetensors"),
        &no_sinks.path().join("model.safetensors"),
        ".sinks",
    );
    let err = load_err(no_sinks.path());
    assert!(matches!(&err, Error::MissingTensor(n) if n.ends_with("self_attn.sinks")), "{err}");
}

/// Copies the safetensors file `src` to `dst` without the tensors whose names end with `suffix`.
fn rewrite_without(src: &Path, dst: &Path, suffix: &str) {
    let bytes = std::fs::read(src).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        st.tensors().into_iter().filter(|(n, _)| !n.ends_with(suffix)).collect();
    safetensors::serialize_to_file(kept, None, dst).unwrap();
}

fn score(dir: &Path, format: WeightFormat, tokens: &[u32]) -> (Vec<f32>, WeightFormat) {
    let mut o = EngineOptions::new(dir).with_format(format);
    o.context = Some(64);
    let e = Engine::load_on(gpu(), &o).unwrap_or_else(|err| panic!("{}: {err}", dir.display()));
    (e.score(tokens).unwrap().logprobs, e.expert_slot_layout().unwrap().format)
}

#[test]
fn convert_keeps_mxfp4_experts_and_resident_biases() {
    let tokens: Vec<u32> = (0..40).map(|i| (i * 11 + 5) % 300).collect();
    // MXFP4 experts go into the store as they are, whatever the expert option says: the
    // converted model (f16 dense) scores exactly as the directory loaded in f16.
    let src = fixture("gpt_oss_mxfp4");
    let out = TempDir::new("gptoss-convert-mxfp4");
    let options = ConvertOptions { dense: WeightFormat::F16, threads: 1, ..Default::default() };
    convert(&src, out.path(), &options, &mut |_| {}).unwrap();
    let (direct, _) = score(&src, WeightFormat::F16, &tokens);
    let (converted, format) = score(out.path(), WeightFormat::F16, &tokens);
    assert_eq!(format, WeightFormat::Padded(GgmlType::Mxfp4));
    assert_eq!(converted, direct, "converted MXFP4 model == the directory");
    // A bf16 checkpoint converts to int4 with its expert biases resident in f32.
    let src = fixture("gpt_oss");
    let out = TempDir::new("gptoss-convert-int4");
    convert(&src, out.path(), &ConvertOptions { threads: 1, ..Default::default() }, &mut |_| {}).unwrap();
    let resident = Checkpoint::open_file(&out.path().join("resident.safetensors")).unwrap();
    assert!(resident.is_f32("model.layers.0.mlp.experts.gate_up_proj_bias"));
    // (engine_int4 checks int4 runs against the reference on the same weights.)
    let (lp, format) = score(out.path(), WeightFormat::F32, &tokens);
    assert!(matches!(format, WeightFormat::Int4(_)));
    assert!(lp.iter().all(|v| v.is_finite()));
}

#[test]
fn hub_config_parses() {
    // openai/gpt-oss-20b's config.json (the hub layout: `rope_scaling`, `experts_per_token`,
    // `quantization_config` mxfp4), layer_types shortened to its alternation.
    let cfg = serde_json::json!({
        "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
        "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
        "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss",
        "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
        "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": false,
        "pad_token_id": 199999, "rms_norm_eps": 1e-05, "rope_theta": 150000,
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
            "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
            "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
        "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
        "tie_word_embeddings": false, "use_cache": true, "vocab_size": 201088,
        "layer_types": (0..24).map(|i| if i % 2 == 0 { "sliding_attention" } else { "full_attention" }).collect::<Vec<_>>()
    });
    let spec = ArchSpec::from_config(&cfg).unwrap();
    assert_eq!((spec.heads, spec.kv_heads, spec.head_dim, spec.hidden), (64, 8, 64, 2880));
    assert!(spec.qkv_bias && spec.o_bias && spec.attention_sinks);
    assert_eq!(spec.rms_eps, 1e-5);
    assert_eq!(spec.layer_windows[..4], [Some(128), None, Some(128), None]);
    let m = spec.moe.as_ref().unwrap();
    assert_eq!((m.num_experts, m.top_k, m.expert_intermediate), (32, 4, 2880));
    assert!(m.router_logit_bias && m.norm_topk_prob);
    assert_eq!(m.expert_act, ExpertAct::ClampedSwiGlu { alpha: 1.702, limit: 7.0 });
    assert!(matches!(
        spec.rope.scaling,
        moestream::model::RopeScaling::Yarn { factor: 32.0, original_max_positions: 4096, truncate: false, .. }
    ));
    // transformers' defaults when the config leaves them out.
    let mut bare = cfg.clone();
    for k in ["rope_scaling", "layer_types", "rms_norm_eps", "swiglu_limit", "attention_bias"] {
        bare.as_object_mut().unwrap().remove(k);
    }
    let spec = ArchSpec::from_config(&bare).unwrap();
    assert!(matches!(spec.rope.scaling, moestream::model::RopeScaling::Yarn { factor: 32.0, truncate: false, .. }));
    assert_eq!(spec.layer_windows[..2], [Some(128), None]);
    assert!(spec.o_bias && spec.qkv_bias);
}

#[test]
fn llama_cpp_gguf_equals_the_directory() {
    // tests/fixtures/gguf/make_gpt_oss.py: llama.cpp's converter on gpt_oss_mxfp4 with
    // swiglu_limit 7.0 (the limit llama.cpp hardcodes); the same MXFP4 experts, BF16 matrices,
    // F32 router, biases and sinks.
    let gguf = fixtures_dir().join("gguf/gpt_oss-mxfp4.gguf");
    let dir = edited_from("gpt_oss_mxfp4", "gptoss-gguf-source", |c| c["swiglu_limit"] = serde_json::json!(7.0));
    let cache = TempDir::new("gptoss-gguf-cache");
    let tokens: Vec<u32> = (0..40).map(|i| (i * 13 + 7) % 300).collect();
    let run = |path: &Path| {
        let mut o = EngineOptions::new(path).with_format(WeightFormat::F32);
        o.context = Some(64);
        o.kv_dtype = moestream::ops::KvDtype::F32;
        o.cache_dir = Some(cache.path().to_path_buf());
        let e = Engine::load_on(gpu(), &o).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        assert_eq!(e.expert_slot_layout().unwrap().format, WeightFormat::Padded(GgmlType::Mxfp4));
        e.score(&tokens).unwrap().logprobs
    };
    let (from_gguf, from_dir) = (run(&gguf), run(dir.path()));
    let err = common::max_abs_diff(&from_gguf, &from_dir);
    println!("gpt-oss GGUF vs Hugging Face directory: max |Δ logprob| = {err:.2e}");
    assert!(err < 1e-5, "GGUF and directory differ by {err}");
}
