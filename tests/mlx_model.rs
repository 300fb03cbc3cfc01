//! MLX 4-bit checkpoints read losslessly as moestream's affine int4
//! (`tests/fixtures/mlx/llama_4bit`, written by `make_mlx.py` with MLX's affine quantizer in
//! numpy): every quantized tensor's values equal the script's dequantization bit for bit, the
//! engine (which uploads the int4 blobs as stored) equals the CPU reference on those weights
//! (log-probs within 1e-3, greedy exact; `olmoe_4bit` with its experts stacked as mlx_lm's
//! `switch_mlp`, streamed bit-identical to resident), and 8-bit or group-128 MLX models are
//! refused by name.

mod common;

use std::path::PathBuf;

use common::{fixtures_dir, gpu, max_abs_diff, TempDir};
use moestream::decoder::DecoderOptions;
use moestream::model::{ArchSpec, Checkpoint};
use moestream::ops::{KvDtype, WeightFormat};
use moestream::reference::ReferenceModel;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions};
use moestream::Error;

/// The MLX fixtures and the Hugging Face fixture each was made from.
const FIXTURES: [(&str, &str); 2] = [("llama_4bit", "llama"), ("olmoe_4bit", "olmoe")];

fn dir() -> PathBuf {
    fixtures_dir().join("mlx/llama_4bit")
}

#[test]
fn mlx_tensors_read_as_their_dequantization() {
    for (mlx, _) in FIXTURES {
        let ck = Checkpoint::open(&fixtures_dir().join("mlx").join(mlx)).unwrap();
        let p = ck.mlx_params().unwrap();
        assert_eq!(WeightFormat::Int4(p).name(), "int4-affine-g32");
        let reference =
            Checkpoint::open_file(&fixtures_dir().join(format!("mlx/{mlx}_dequantized.safetensors"))).unwrap();
        let mut checked = 0;
        for name in reference.names() {
            let shape = reference.shape(name).unwrap().to_vec();
            let want = reference.tensor(name, &shape).unwrap().data;
            // Stacked experts (mlx_lm's switch_mlp) are read per expert.
            let parts: Vec<String> = match name.split_once(".mlp.switch_mlp.") {
                Some((pre, leaf)) => (0..shape[0]).map(|e| format!("{pre}.mlp.experts.{e}.{leaf}")).collect(),
                None => vec![name.to_string()],
            };
            let inner = &shape[shape.len() - 2..];
            for (part, want) in parts.iter().zip(want.chunks(inner[0] * inner[1])) {
                let got = ck.tensor(part, inner).unwrap();
                assert!(got.int4.is_some(), "{mlx} {part} is not kept as int4");
                assert!(got.data.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()), "{mlx} {part}");
                checked += 1;
            }
        }
        assert!(checked >= 9, "{mlx}: {checked} tensors");
    }
}

#[test]
fn engine_equals_reference_on_mlx_weights() {
    for (mlx, hf) in FIXTURES {
        check_engine(&fixtures_dir().join("mlx").join(mlx), hf);
    }
}

fn check_engine(dir: &std::path::Path, hf: &str) {
    let mut o = EngineOptions::new(dir);
    o.context = Some(256);
    // Compared with the f32 reference: an f32 KV cache.
    o.kv_dtype = KvDtype::F32;
    let engine = Engine::load_on(gpu(), &o).unwrap();
    let format = WeightFormat::Int4(Checkpoint::open(dir).unwrap().mlx_params().unwrap());
    let decoder = DecoderOptions {
        experts: format,
        dense: format,
        context: 256,
        kv_dtype: KvDtype::F32,
        kv_budget: u64::MAX,
        max_batch: 64,
        window_rings: true,
        state_snapshots: 0,
        streaming: None,
        mtp: false,
    };
    let reference = ReferenceModel::load(dir).unwrap().rounded_like(&decoder).unwrap();
    let golden: common::Golden =
        serde_json::from_str(&std::fs::read_to_string(fixtures_dir().join(hf).join("golden.json")).unwrap()).unwrap();
    for p in golden.prompts.iter().filter(|p| (2..=64).contains(&p.tokens.len())) {
        let gpu_lp = engine.score(&p.tokens).unwrap().logprobs;
        let err = max_abs_diff(&gpu_lp, &reference.log_probs(&p.tokens).unwrap());
        println!(
            "{hf} {}: |GPU-CPU| {err:.2e}, |MLX 4-bit - golden| {:.3}",
            p.name,
            max_abs_diff(&gpu_lp, &p.logprobs)
        );
        assert!(err < 1e-3, "{hf} {}: {err}", p.name);
        let opts = GenerateOptions { max_tokens: 6, ignore_eos: true, ..Default::default() };
        let g = engine.generate(&p.tokens, &opts, |_, _| true).unwrap();
        assert_eq!(g.tokens, reference.greedy(&p.tokens, 6).unwrap(), "{hf} {}: greedy", p.name);
    }
    if hf == "olmoe" {
        // Streamed through 2 slots (one layer's top-k): bit-identical to resident.
        o.budget = ExpertBudget::Slots(2);
        let streamed = Engine::load_on(gpu(), &o).unwrap();
        for p in golden.prompts.iter().filter(|p| (2..=64).contains(&p.tokens.len())) {
            assert_eq!(streamed.score(&p.tokens).unwrap().logprobs, engine.score(&p.tokens).unwrap().logprobs);
        }
    }
}

#[test]
fn unsupported_mlx_quantization_is_refused() {
    for (bits, group, what) in [(8, 32, "8-bit"), (4, 128, "group size 128")] {
        let tmp = TempDir::new("mlx_refused");
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(dir().join(f), tmp.path().join(f)).unwrap();
        }
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(tmp.path().join("config.json")).unwrap()).unwrap();
        cfg["quantization"] = serde_json::json!({"bits": bits, "group_size": group});
        std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
        assert!(ArchSpec::from_dir(tmp.path()).is_ok());
        match Checkpoint::open(tmp.path()) {
            Err(Error::UnsupportedConfig(m)) => assert!(m.contains("MLX"), "{what}: {m}"),
            other => panic!("{what}: {:?}", other.err()),
        }
    }
}
