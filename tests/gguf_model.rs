//! A GGUF model run natively: `tests/fixtures/gguf/qwen3_moe.gguf` (and the same model split in
//! three parts), written by `make_model.py` from the `qwen3_moe` Hugging Face fixture with
//! llama.cpp's `gguf` package in a mix of Q8_0, Q4_0, MXFP4, BF16 and F32. The engine must
//! equal the CPU reference on the same dequantized weights (log-probs within 1e-3, greedy
//! exact), resident and streamed (streamed bit-identical to resident); the architecture read
//! from the GGUF metadata must equal the one from `config.json`; the GGUF tokenizer must encode
//! like the fixture's `tokenizer.json`; an all-F16 GGUF of the same model must match
//! transformers' golden log-probs. `qwen3_moe-q4km.gguf` (`make_q4km.py`) has Q4_K_M's expert
//! types, gate/up Q4_K and down Q6_K, which the slots keep.

mod common;

use std::path::PathBuf;

use common::{fixtures_dir, gpu, max_abs_diff, Golden, TempDir};
use moestream::model::gguf::{arch, GgmlType, GgufError, GgufModel};
use moestream::model::{ArchSpec, Checkpoint};
use moestream::ops::{KvDtype, WeightFormat};
use moestream::reference::ReferenceModel;
use moestream::runtime::tokenizer::Tokenizer;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions};
use moestream::store::{ExpertStore, StoreEncoding};
use moestream::Error;

fn gguf(name: &str) -> PathBuf {
    fixtures_dir().join("gguf").join(name)
}

fn golden_of(fixture: &str) -> Golden {
    serde_json::from_str(&std::fs::read_to_string(fixtures_dir().join(fixture).join("golden.json")).unwrap()).unwrap()
}

fn golden() -> Golden {
    golden_of("qwen3_moe")
}

/// The engine on `path` (a GGUF file converts into a cache of its own, removed after loading:
/// the engine keeps the store open).
fn engine(path: PathBuf, budget: ExpertBudget) -> Engine {
    engine_on(gpu(), path, budget)
}

/// [`engine`] on `gpu`.
fn engine_on(gpu: std::sync::Arc<moestream::gpu::Gpu>, path: PathBuf, budget: ExpertBudget) -> Engine {
    let cache = TempDir::new("gguf_cache");
    let mut o = EngineOptions::new(path);
    o.context = Some(256);
    // Compared with the f32 reference: an f32 KV cache.
    o.kv_dtype = KvDtype::F32;
    o.budget = budget;
    o.cache_dir = Some(cache.path().to_path_buf());
    Engine::load_on(gpu, &o).unwrap()
}

#[test]
fn metadata_gives_the_config_json_architecture() {
    let m = GgufModel::open(&gguf("qwen3_moe.gguf")).unwrap();
    let from_gguf = arch::spec_from_gguf(&m).unwrap();
    assert_eq!(from_gguf, ArchSpec::from_dir(&fixtures_dir().join("qwen3_moe")).unwrap());
    let types = arch::expert_types(&m, from_gguf.layers);
    let moe: Vec<bool> = types.iter().map(Option::is_some).collect();
    assert_eq!(moe, from_gguf.moe_layers, "experts where the MoE layers are");
    assert!(types.iter().flatten().all(|t| *t == [GgmlType::BF16, GgmlType::BF16]));
}

#[test]
fn engine_equals_reference_on_dequantized_weights() {
    let path = gguf("qwen3_moe.gguf");
    let spec = arch::spec_from_gguf(&GgufModel::open(&path).unwrap()).unwrap();
    let ck = Checkpoint::from_gguf(GgufModel::open(&path).unwrap(), &spec).unwrap();
    let reference = ReferenceModel::from_checkpoint(spec, &ck).unwrap();
    let resident = engine(path.clone(), ExpertBudget::Auto);
    let streamed = engine(path, ExpertBudget::Slots(3));
    let split = engine(gguf("qwen3_moe-split-00002-of-00003.gguf"), ExpertBudget::Auto);
    for p in golden().prompts.iter().filter(|p| (2..=64).contains(&p.tokens.len())) {
        let gpu_lp = resident.score(&p.tokens).unwrap().logprobs;
        let cpu_lp = reference.log_probs(&p.tokens).unwrap();
        let err = max_abs_diff(&gpu_lp, &cpu_lp);
        println!("{}: |GPU-CPU| {err:.2e}, |GGUF - f16 golden| {:.3}", p.name, max_abs_diff(&gpu_lp, &p.logprobs));
        assert!(err < 1e-3, "{}: GPU vs reference on the GGUF weights: {err}", p.name);
        let streamed_lp = streamed.score(&p.tokens).unwrap().logprobs;
        assert_eq!(streamed_lp, gpu_lp, "{}: streamed (3 slots) vs resident", p.name);
        assert_eq!(split.score(&p.tokens).unwrap().logprobs, gpu_lp, "{}: split file vs single", p.name);
        let opts = GenerateOptions { max_tokens: 6, ignore_eos: true, ..Default::default() };
        let g = resident.generate(&p.tokens, &opts, |_, _| true).unwrap();
        assert_eq!(g.tokens, reference.greedy(&p.tokens, 6).unwrap(), "{}: greedy", p.name);
    }
}

#[test]
fn q4_k_m_experts_keep_their_two_types() {
    // Q4_K_M's experts: gate/up Q4_K, down Q6_K (make_q4km.py). Each kernel reads its own type,
    // so the slots hold the GGUF bytes (4.5 + 4.5 + 6.5625 bits a weight), not f32.
    let path = gguf("qwen3_moe-q4km.gguf");
    let m = GgufModel::open(&path).unwrap();
    let spec = arch::spec_from_gguf(&m).unwrap();
    assert!(arch::expert_types(&m, spec.layers).iter().all(|t| *t == Some([GgmlType::Q4K, GgmlType::Q6K])));
    let ck = Checkpoint::from_gguf(m, &spec).unwrap();
    let reference = ReferenceModel::from_checkpoint(spec.clone(), &ck).unwrap();
    let resident = engine(path.clone(), ExpertBudget::Auto);
    let streamed = engine(path, ExpertBudget::Slots(2));
    assert_eq!(streamed.expert_slots(), Some(2), "8 experts streamed through 2 slots");
    let (h, i) = (spec.hidden, spec.moe.as_ref().unwrap().expert_intermediate);
    // Q4_K blocks of 256 as stored; Q6_K's 210-byte blocks padded to 224 for 16-byte loads.
    let expected = 2 * (i * h / 256 * 144) + h * i / 256 * 224;
    assert!(expected * 5 < 3 * i * h * 4, "over 5x under f32's {} bytes", 3 * i * h * 4);
    for e in [&resident, &streamed] {
        let layout = e.expert_slot_layout().unwrap();
        assert_eq!(layout.format_name(), "q4_k+q6_k-padded");
        assert_eq!(layout.slot_bytes, expected, "slot bytes: the experts stayed quantized");
    }
    let mut checked = 0;
    for p in golden().prompts.iter().filter(|p| (2..=64).contains(&p.tokens.len())) {
        let gpu_lp = resident.score(&p.tokens).unwrap().logprobs;
        let err = max_abs_diff(&gpu_lp, &reference.log_probs(&p.tokens).unwrap());
        println!("{}: |GPU-CPU| {err:.2e}", p.name);
        assert!(err < 1e-3, "{}: GPU vs reference on the Q4_K/Q6_K weights: {err}", p.name);
        assert_eq!(streamed.score(&p.tokens).unwrap().logprobs, gpu_lp, "{}: streamed (2 slots) vs resident", p.name);
        let opts = GenerateOptions { max_tokens: 6, ignore_eos: true, ..Default::default() };
        let g = resident.generate(&p.tokens, &opts, |_, _| true).unwrap();
        assert_eq!(g.tokens, reference.greedy(&p.tokens, 6).unwrap(), "{}: greedy", p.name);
        checked += 1;
    }
    assert!(checked > 0);
}

#[test]
fn f16_gguf_matches_transformers() {
    // Every matrix F16 (the source's own values): the tensor mapping, RoPE layout and metadata
    // must reproduce transformers' log-probs, not merely the reference on the same weights.
    let e = engine(gguf("qwen3_moe-f16.gguf"), ExpertBudget::Auto);
    for p in golden().prompts.iter().filter(|p| (2..=64).contains(&p.tokens.len())) {
        let err = max_abs_diff(&e.score(&p.tokens).unwrap().logprobs, &p.logprobs);
        assert!(err < 1e-3, "{}: F16 GGUF vs transformers: {err}", p.name);
    }
}

#[test]
fn llama_gguf_with_permuted_qk_matches_transformers() {
    // llama.cpp's converter interleaves q/k rows per head; reading must put them back.
    let path = gguf("llama-bf16.gguf");
    let spec = arch::spec_from_gguf(&GgufModel::open(&path).unwrap()).unwrap();
    assert_eq!(spec, ArchSpec::from_dir(&fixtures_dir().join("llama")).unwrap());
    let e = engine(path, ExpertBudget::Auto);
    for p in golden_of("llama").prompts.iter().filter(|p| (2..=64).contains(&p.tokens.len())) {
        let err = max_abs_diff(&e.score(&p.tokens).unwrap().logprobs, &p.logprobs);
        assert!(err < 1e-3, "{}: BF16 llama GGUF vs transformers: {err}", p.name);
    }
}

/// The engine on `file` (llama.cpp's converter on Hugging Face fixture `fixture`,
/// make_llama_cpp_converted.py) against transformers' golden log-probs (within 1e-3) and greedy
/// tokens, resident and streamed through 3 slots (identical).
fn matches_transformers(file: &str, fixture: &str) {
    matches_golden(file, &golden_of(fixture));
}

/// [`matches_transformers`] against `golden`.
fn matches_golden(file: &str, golden: &Golden) {
    let path = gguf(file);
    let resident = engine(path.clone(), ExpertBudget::Auto);
    let streamed = engine(path, ExpertBudget::Slots(3));
    let mut checked = 0;
    for p in golden.prompts.iter().filter(|p| (2..=64).contains(&p.tokens.len())) {
        let lp = resident.score(&p.tokens).unwrap().logprobs;
        let err = max_abs_diff(&lp, &p.logprobs);
        println!("{file} {}: |GGUF - transformers| {err:.2e}", p.name);
        assert!(err < 1e-3, "{file} {}: vs transformers: {err}", p.name);
        assert_eq!(streamed.score(&p.tokens).unwrap().logprobs, lp, "{file} {}: streamed vs resident", p.name);
        let opts = GenerateOptions { max_tokens: p.greedy.len(), ignore_eos: true, ..Default::default() };
        let greedy = resident.generate(&p.tokens, &opts, |_, _| true).unwrap().tokens;
        assert_eq!(greedy, p.greedy, "{file} {}: greedy", p.name);
        checked += 1;
    }
    assert!(checked > 0);
}

#[test]
fn glm4moe_gguf_from_llama_cpps_converter_matches_transformers() {
    // Partial rotary, YaRN, q/k norms and biases, sigmoid + bias routing in groups, a shared
    // expert, a leading dense layer, and a block count that includes the multi-token-prediction
    // block, all read from llama.cpp's metadata and names.
    let spec = arch::spec_from_gguf(&GgufModel::open(&gguf("glm4_moe-bf16.gguf")).unwrap()).unwrap();
    assert_eq!(spec, ArchSpec::from_dir(&fixtures_dir().join("glm4_moe")).unwrap());
    matches_transformers("glm4_moe-bf16.gguf", "glm4_moe");
}

#[test]
fn deepseek2_ggufs_from_llama_cpps_converter_match_transformers() {
    // MLA (kv_b split into attn_k_b + attn_v_b by the converter, put back on reading; q_proj
    // for V2, q_a/q_b for V3), YaRN from yarn_log_multiplier, softmax group-limited routing
    // (V2) and sigmoid + bias routing (V3, expert_gating_func 2), shared experts, the leading
    // dense layer, expert_weights_scale.
    for (file, fixture) in [("deepseek_v2-bf16.gguf", "deepseek_v2"), ("deepseek_v3-f32.gguf", "deepseek_v3")] {
        let spec = arch::spec_from_gguf(&GgufModel::open(&gguf(file)).unwrap()).unwrap();
        let hf = ArchSpec::from_dir(&fixtures_dir().join(fixture)).unwrap();
        assert_eq!(
            (spec.family, spec.layers, &spec.moe, &spec.moe_layers),
            (hf.family, hf.layers, &hf.moe, &hf.moe_layers)
        );
        matches_transformers(file, fixture);
    }
}

#[test]
fn hybrid_ggufs_from_llama_cpps_converter_match_transformers() {
    // llama.cpp's `qwen35moe` and `qwen3next` (tests/fixtures/gguf/make_hybrid.py): the
    // zero-centred norms stored with their 1 added, `ssm_a` = -exp(A_log), the conv squeezed,
    // the in-projection split into attn_qkv + attn_gate + ssm_beta/ssm_alpha (qwen35moe, whose
    // 4 value heads on 2 key heads the converter also reorders from grouped to tiled) or
    // attn_qkv + attn_gate + ssm_ba grouped per key head (qwen3next), all put back on reading.
    let spec = arch::spec_from_gguf(&GgufModel::open(&gguf("qwen3_5_moe-bf16.gguf")).unwrap()).unwrap();
    let mut hf = ArchSpec::from_dir(&fixtures_dir().join("qwen3_5_moe")).unwrap();
    hf.hybrid.as_mut().unwrap().fused_projection = false;
    assert_eq!(spec, hf);
    matches_transformers("qwen3_5_moe-bf16.gguf", "qwen3_5_moe");
    let golden = std::fs::read_to_string(gguf("qwen3_next_moe-golden.json")).unwrap();
    matches_golden("qwen3_next_moe-bf16.gguf", &serde_json::from_str(&golden).unwrap());
}

#[test]
fn quantized_hybrid_gguf_equals_the_reference() {
    // llama-quantize's Q4_K_M of the qwen35moe file: its 64-wide rows fall back to Q5_0 (and
    // Q8_0), so the reordered value-head rows and ssm_out columns are of quantized tensors and
    // the experts' slots hold Q5_0 blocks.
    let m = GgufModel::open(&gguf("qwen3_5_moe-q4km.gguf")).unwrap();
    assert_eq!(m.info("blk.0.attn_qkv.weight").unwrap().ggml_type, GgmlType::Q5_0);
    let spec = arch::spec_from_gguf(&m).unwrap();
    assert!(arch::expert_types(&m, spec.layers).iter().flatten().all(|t| t[0] == GgmlType::Q5_0));
    check_against_reference(gguf("qwen3_5_moe-q4km.gguf"), 3);
}

#[test]
fn gguf_tokenizer_encodes_like_tokenizer_json() {
    let m = GgufModel::open(&gguf("qwen3_moe.gguf")).unwrap();
    let ours = Tokenizer::from_gguf(&m).unwrap();
    let hf = Tokenizer::from_dir(&fixtures_dir().join("qwen3_moe")).unwrap();
    for text in [
        "The quick brown fox jumps over the lazy dog.",
        "  leading spaces,\ttabs\nand newlines\n\n",
        "numbers 12345 and punctuation!?; 'quotes' don't",
        "ünïcödé — 漢字 🙂",
        "<|endoftext|>text after the special token",
        "",
    ] {
        let ids = hf.encode(text).unwrap();
        assert_eq!(ours.encode(text).unwrap(), ids, "{text:?}");
        assert_eq!(ours.decode(&ids).unwrap(), hf.decode(&ids).unwrap(), "{text:?}");
    }
    assert!(ours.chat_template().unwrap().contains("messages"));
}

#[test]
fn incomplete_split_sets_and_foreign_architectures_are_refused() {
    let dir = TempDir::new("gguf_split");
    for k in [1, 3] {
        let name = format!("qwen3_moe-split-{k:05}-of-00003.gguf");
        std::fs::copy(gguf(&name), dir.path().join(&name)).unwrap();
    }
    let first = dir.path().join("qwen3_moe-split-00001-of-00003.gguf");
    assert!(matches!(GgufModel::open(&first), Err(GgufError::Io { .. })));
    // A part renamed into another set's position.
    std::fs::copy(gguf("qwen3_moe-split-00003-of-00003.gguf"), dir.path().join("qwen3_moe-split-00002-of-00003.gguf"))
        .unwrap();
    assert!(matches!(GgufModel::open(&first), Err(GgufError::Split { .. })));
    // The quants file is a GGUF of architecture `quants`.
    let quants = GgufModel::open(&gguf("quants.gguf")).unwrap();
    assert!(matches!(arch::spec_from_gguf(&quants), Err(Error::UnsupportedArchitecture(_))));
}

#[test]
fn llama_sentencepiece_tokenizer_encodes_like_sentencepiece() {
    // spm.gguf / spm_encodings.json: a SentencePiece BPE model (byte fallback, a user-defined
    // symbol) and sentencepiece's own encodings, written by make_spm.py.
    let ours = Tokenizer::from_gguf(&GgufModel::open(&gguf("spm.gguf")).unwrap()).unwrap();
    let cases: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(gguf("spm_encodings.json")).unwrap()).unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let ids: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        assert_eq!(ours.encode(text).unwrap(), ids, "{text:?}");
        assert_eq!(ours.decode(&ids).unwrap(), text, "{text:?}");
    }
}

/// Engine vs the CPU reference on the same dequantized weights (log-probs within 1e-3, greedy
/// exact) and streamed through `slots` slots vs resident (identical), over the golden prompts.
fn check_against_reference(path: PathBuf, slots: usize) {
    let spec = arch::spec_from_gguf(&GgufModel::open(&path).unwrap()).unwrap();
    let ck = Checkpoint::from_gguf(GgufModel::open(&path).unwrap(), &spec).unwrap();
    let reference = ReferenceModel::from_checkpoint(spec, &ck).unwrap();
    let resident = engine(path.clone(), ExpertBudget::Auto);
    let streamed = engine(path.clone(), ExpertBudget::Slots(slots));
    // What GPUs run: decode kernels in their layouts, prefill experts gathered into the tiled
    // GEMM (`ExpertPrefill::Gather`; lavapipe's own layout runs them pair by pair).
    let gpu_layouts = engine_on(common::gpu_layouts(), path, ExpertBudget::Slots(slots));
    let mut checked = 0;
    for p in golden().prompts.iter().filter(|p| (2..=64).contains(&p.tokens.len())) {
        let gpu_lp = resident.score(&p.tokens).unwrap().logprobs;
        let want = reference.log_probs(&p.tokens).unwrap();
        let err = max_abs_diff(&gpu_lp, &want);
        let layouts_err = max_abs_diff(&gpu_layouts.score(&p.tokens).unwrap().logprobs, &want);
        println!("{}: |GPU-CPU| {err:.2e}, in the GPU layouts {layouts_err:.2e}", p.name);
        assert!(err < 1e-3, "{}: GPU vs reference: {err}", p.name);
        assert!(layouts_err < 1e-3, "{}: GPU layouts vs reference: {layouts_err}", p.name);
        assert_eq!(streamed.score(&p.tokens).unwrap().logprobs, gpu_lp, "{}: streamed vs resident", p.name);
        let opts = GenerateOptions { max_tokens: 6, ignore_eos: true, ..Default::default() };
        let g = resident.generate(&p.tokens, &opts, |_, _| true).unwrap();
        assert_eq!(g.tokens, reference.greedy(&p.tokens, 6).unwrap(), "{}: greedy", p.name);
        checked += 1;
    }
    assert!(checked > 0);
}

#[test]
fn down_types_that_change_between_layers_stay_quantized() {
    // Q4_K_M files give down Q6_K on some layers and Q4_K on others (make_q4km.py's mixed file:
    // layer 0 Q6_K, layer 1 Q4_K). Each layer's kernels read its own types; the arena's slots
    // are the larger layer's.
    let path = gguf("qwen3_moe-q4km-mixed.gguf");
    let m = GgufModel::open(&path).unwrap();
    let spec = arch::spec_from_gguf(&m).unwrap();
    assert_eq!(arch::expert_types(&m, 2), vec![Some([GgmlType::Q4K, GgmlType::Q6K]), Some([GgmlType::Q4K; 2])]);
    let (h, i) = (spec.hidden, spec.moe.as_ref().unwrap().expert_intermediate);
    let layout = engine(path.clone(), ExpertBudget::Auto).expert_slot_layout().unwrap();
    assert_eq!(layout.format_name(), "q4_k+q6_k-padded");
    assert_eq!(layout.slot_bytes, 2 * (i * h / 256 * 144) + h * i / 256 * 224, "quantized slots, not f32");
    check_against_reference(path, 2);
}

#[test]
fn q4_0_q6_k_and_q8_0_experts_are_restaged_for_aligned_loads() {
    // make_q4km.py's qwen3_moe-restaged.gguf: layer 0 gate/up Q4_0 and down Q6_K, layer 1
    // gate/up Q8_0 and down Q4_0. The store keeps the file's blocks; its reads restage Q4_0 as
    // int4 and Q6_K and Q8_0 in padded blocks (moving down's blob in layer 1), the same weights:
    // the engine equals the reference on the GGUF's dequantized weights, streamed bit-identical.
    let path = gguf("qwen3_moe-restaged.gguf");
    let m = GgufModel::open(&path).unwrap();
    let spec = arch::spec_from_gguf(&m).unwrap();
    let (q4, q6, q8) = (GgmlType::Q4_0, GgmlType::Q6K, GgmlType::Q8_0);
    assert_eq!(arch::expert_types(&m, 2), vec![Some([q4, q6]), Some([q8, q4])]);
    let (h, i) = (spec.hidden, spec.moe.as_ref().unwrap().expert_intermediate);
    let layout = engine(path.clone(), ExpertBudget::Auto).expert_slot_layout().unwrap();
    assert_eq!(layout.format_name(), "q8_0-padded+int4-symmetric-g32", "the wider layer's slots");
    let int4 = WeightFormat::Int4(moestream::quant::Q4_0_AS_INT4).blob_bytes(h, i).unwrap();
    assert_eq!(layout.slot_bytes, 2 * (i * h / 32 * 36) + int4);
    check_against_reference(path, 2);
}

#[test]
fn gguf_converts_into_an_expert_store_of_its_own_blocks() {
    // `convert FILE.gguf OUT`: one extent per expert holding the GGUF's gate, up and down
    // blocks unchanged (each layer in its own types), a version-2 store naming them.
    let path = gguf("qwen3_moe-q4km-mixed.gguf");
    let out = TempDir::new("gguf_convert");
    let dir = out.path().join("m");
    let options = moestream::convert::ConvertOptions::default();
    let summary = moestream::convert::convert(&path, &dir, &options, &mut |_| {}).unwrap();
    assert_eq!(summary.experts, 8);
    assert_eq!(summary.experts_encoding, "gguf:q4_k+q6_k,q4_k+q4_k");
    let m = GgufModel::open(&path).unwrap();
    let spec = arch::spec_from_gguf(&m).unwrap();
    let store = ExpertStore::open(dir.join("experts.bin"), spec.hash()).unwrap();
    let header = std::fs::read(dir.join("experts.bin")).unwrap();
    assert_eq!(u32::from_le_bytes(header[8..12].try_into().unwrap()), 2, "format version 2");
    assert_eq!(store.info().encoding, StoreEncoding::Ggml(vec![[GgmlType::Q4K, GgmlType::Q6K], [GgmlType::Q4K; 2]]));
    let (h, i) = (spec.hidden, spec.moe.as_ref().unwrap().expert_intermediate);
    let mut buf = store.alloc_buffer();
    for layer in 0..2 {
        for e in 0..4 {
            store.read_expert(layer, e, &mut buf).unwrap();
            let types = [GgmlType::Q4K, GgmlType::Q4K, [GgmlType::Q6K, GgmlType::Q4K][layer]];
            let (offsets, _) = moestream::store::ggml_extent([types[0], types[2]], h, i).unwrap();
            for (k, role) in ["gate", "up", "down"].into_iter().enumerate() {
                let (rows, cols) = if k == 2 { (h, i) } else { (i, h) };
                let len = rows * types[k].row_bytes(cols);
                let stacked = m.bytes(&format!("blk.{layer}.ffn_{role}_exps.weight")).unwrap();
                assert_eq!(
                    &buf[offsets[k]..offsets[k] + len],
                    &stacked[e * len..(e + 1) * len],
                    "layer {layer} expert {e} {role}: the GGUF's bytes"
                );
            }
        }
    }
    // The converted directory runs as the GGUF does, resident and streamed.
    let load = |budget| {
        let mut o = EngineOptions::new(&dir);
        o.context = Some(256);
        o.kv_dtype = KvDtype::F32;
        o.budget = budget;
        Engine::load_on(gpu(), &o).unwrap()
    };
    let direct = engine(path.clone(), ExpertBudget::Auto);
    let (resident, streamed) = (load(ExpertBudget::Auto), load(ExpertBudget::Slots(2)));
    for p in golden().prompts.iter().filter(|p| (2..=64).contains(&p.tokens.len())).take(2) {
        let lp = resident.score(&p.tokens).unwrap().logprobs;
        assert_eq!(lp, direct.score(&p.tokens).unwrap().logprobs, "{}: converted dir vs running the file", p.name);
        assert_eq!(lp, streamed.score(&p.tokens).unwrap().logprobs, "{}: streamed vs resident", p.name);
    }
}

#[test]
fn running_a_gguf_file_converts_it_once_into_the_cache() {
    let cache = TempDir::new("gguf_run_cache");
    let root = cache.path();
    let path = gguf("qwen3_moe.gguf");
    let options = moestream::convert::ConvertOptions::default();
    let dir = moestream::convert::cached_conversion(&path, root, &options, &mut |_| {}).unwrap();
    let manifest = dir.join("model.json");
    let written = std::fs::metadata(&manifest).unwrap().modified().unwrap();
    // Other encoding options name the same conversion: GGUF experts are stored as they are.
    let f16 = moestream::convert::ConvertOptions::from_bits(16, 16, Default::default()).unwrap();
    assert_eq!(moestream::convert::cached_conversion(&path, root, &f16, &mut |_| {}).unwrap(), dir);
    assert_eq!(std::fs::metadata(&manifest).unwrap().modified().unwrap(), written, "reused, not converted again");
    let mut o = EngineOptions::new(&path);
    o.context = Some(64);
    o.cache_dir = Some(root.to_path_buf());
    Engine::load_on(gpu(), &o).unwrap();
    assert_eq!(std::fs::metadata(&manifest).unwrap().modified().unwrap(), written, "the engine reused it too");
}
