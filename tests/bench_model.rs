//! `bench model`: the report says which weight formats ran, as the engine loaded them (a
//! Hugging Face directory in what was asked for, a converted or GGUF model in its own), and
//! times what it was asked to.

mod common;

use common::TempDir;

use moestream::bench::model::{self, ModelBenchOptions};
use moestream::ops::WeightFormat;
use moestream::{Engine, EngineOptions};

fn options() -> ModelBenchOptions {
    ModelBenchOptions {
        prompt_tokens: 6,
        decode_tokens: 3,
        runs: 1,
        seed: 1,
        compare_chained: false,
        compare_optimistic: false,
    }
}

#[test]
fn the_report_names_the_weight_formats_that_ran() {
    let cache = TempDir::new("bench_model_cache");
    let int4 = WeightFormat::Int4(Default::default());
    let gguf = common::fixtures_dir().join("gguf/qwen3_moe.gguf");
    for (dir, format, dense, experts) in [
        (common::fixtures_dir().join("mixtral"), WeightFormat::F16, "f16", "f16"),
        (common::fixtures_dir().join("mixtral"), int4, "int4-affine-g32", "int4-affine-g32"),
        // GGUF weights run as stored, whatever is asked for (this file's experts are BF16).
        (gguf, WeightFormat::F16, "as stored", "bf16"),
    ] {
        let mut o = EngineOptions::new(&dir);
        (o.experts, o.dense, o.cache_dir) = (format, format, Some(cache.path().to_path_buf()));
        let r = model::run(|| Engine::load(&o), &options()).unwrap();
        assert_eq!((r.weights.dense.as_str(), r.weights.experts.as_str()), (dense, experts), "{dir:?} {format:?}");
        assert_eq!((r.prompt_tokens, r.decode_tokens, r.runs), (6, 3, 1));
        assert!(r.prefill_tokens_per_s > 0.0 && r.decode_tokens_per_s > 0.0, "{r:?}");
    }
}
