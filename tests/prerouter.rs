//! The prerouter: backprop gradient check, dataset format round trip, collection from a fixture
//! (output unchanged by the observer), training to a stated recall, heads file errors, the
//! heads as a prefetch hint (output exact) and as the routing (exactly the predicted experts).

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::gpu;
use moestream::decoder::RoutingMode;
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::model::ArchSpec;
use moestream::ops::{KvDtype, WeightFormat};
use moestream::prerouter::compat::ModelDims;
use moestream::prerouter::dataset::{
    Dataset, DatasetMeta, DatasetWriter, FORMAT_VERSION, HIDDEN_FILE, META_FILE, TOKENS_FILE,
};
use moestream::prerouter::eval::evaluate;
use moestream::prerouter::features::{Features, RoutingContext};
use moestream::prerouter::head::{Head, HeadDims, HeadParams, Tape};
use moestream::prerouter::heads_file::Heads;
use moestream::prerouter::loss::Loss;
use moestream::prerouter::metrics::top_k;
use moestream::prerouter::routers::{read_routers, ModelTables};
use moestream::prerouter::samples::split_held_out;
use moestream::prerouter::train::{train, TrainOptions, TrainedHead};
use moestream::prerouter::PrerouterError;
use moestream::runtime::collect_routing::collect;
use moestream::runtime::{ExpertBudget, GenerateOptions};
use moestream::util::rng::SplitMix64;
use moestream::{Engine, EngineOptions};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("moestream-prerouter-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fixture(name: &str) -> PathBuf {
    common::fixtures_dir().join(name)
}

/// Loss of `head` on one sample, and the analytic gradient.
fn loss_and_grad(head: &Head, h: &[f32], active: &[usize], targets: &[u16], loss: Loss) -> (f32, HeadParams) {
    let (mut tape, mut scratch) = (Tape::default(), Vec::new());
    let mut logits = vec![0f32; head.dims.experts];
    let mut dlogits = vec![0f32; head.dims.experts];
    head.forward(h, active, &mut tape, &mut logits);
    let l = loss.eval(&logits, targets, &mut dlogits);
    let mut grads = HeadParams::zeros(head.dims);
    head.backward(h, active, &tape, &dlogits, &mut grads, &mut scratch);
    (l, grads)
}

#[test]
fn backprop_matches_finite_differences() {
    // A dense part wider than the skip's input (as with the `deep` feature).
    let dims = HeadDims { hidden: 6, dense: 9, sparse: 10, inner: 5, experts: 5 };
    let mut rng = SplitMix64::new(11);
    for loss in [Loss::Ce, Loss::Bce] {
        let skip: Vec<f32> = (0..dims.experts * dims.hidden).map(|_| rng.next_signed()).collect();
        let mut head = Head::new(dims, Some(&skip), &mut rng);
        // fc2 starts at zero; give every tensor non-trivial values so every path is checked.
        for t in head.params.tensors_mut() {
            for v in t.iter_mut() {
                *v += 0.5 * rng.next_signed();
            }
        }
        let h: Vec<f32> = (0..dims.dense).map(|_| 2.0 * rng.next_signed()).collect();
        let active = [1usize, 4, 7];
        let targets = [0u16, 3];
        let (_, grads) = loss_and_grad(&head, &h, &active, &targets, loss);
        let eps = 1e-2f32;
        let mut checked = 0;
        for (ti, analytic) in grads.tensors().into_iter().enumerate() {
            for (i, &a) in analytic.iter().enumerate() {
                let mut plus = head.clone();
                plus.params.tensors_mut()[ti][i] += eps;
                let mut minus = head.clone();
                minus.params.tensors_mut()[ti][i] -= eps;
                let lp = loss_and_grad(&plus, &h, &active, &targets, loss).0;
                let lm = loss_and_grad(&minus, &h, &active, &targets, loss).0;
                let numeric = (lp - lm) / (2.0 * eps);
                assert!(
                    (numeric - a).abs() <= 2e-3 + 2e-2 * a.abs(),
                    "{loss:?} tensor {ti} entry {i}: analytic {a}, numeric {numeric}"
                );
                checked += 1;
            }
        }
        let d = dims;
        assert_eq!(checked, d.inner * d.input() + d.inner + d.experts * d.inner + d.experts + d.experts * d.hidden);
    }
}

fn sample_meta() -> DatasetMeta {
    DatasetMeta {
        version: FORMAT_VERSION,
        tokens: 0,
        hidden: 3,
        experts: 5,
        top_k: 2,
        moe_layers: vec![1, 3],
        window: 4,
    }
}

#[test]
fn dataset_round_trips_and_rejects_truncation() {
    let dir = scratch("roundtrip");
    let mut w = DatasetWriter::create(&dir, sample_meta()).unwrap();
    for t in 0..7u16 {
        let hidden: Vec<f32> = (0..6).map(|i| f32::from(t) * 10.0 + i as f32).collect();
        w.push(100 + u32::from(t), &hidden, &[t % 5, (t + 1) % 5, (t + 2) % 5, (t + 3) % 5]).unwrap();
    }
    assert!(w.push(0, &[0.0; 5], &[0; 4]).is_err(), "a short token is refused");
    let meta = w.finish().unwrap();
    assert_eq!(meta.tokens, 7);
    let d = Dataset::open(&dir).unwrap();
    assert_eq!(d.meta, meta);
    assert_eq!(d.hidden(5, 1), &[53.0, 54.0, 55.0]);
    assert_eq!(d.topk(5, 1), &[2, 3]);
    assert!(d.starts_sequence(4) && !d.starts_sequence(5));
    assert_eq!((d.token(5), d.token(7)), (Some(105), None));
    // A version 1 dataset (no token ids) still reads, without tokens.
    let v1 = serde_json::to_string(&DatasetMeta { version: 1, ..meta.clone() }).unwrap();
    std::fs::write(dir.join(META_FILE), v1).unwrap();
    assert_eq!(Dataset::open(&dir).unwrap().token(5), None);
    std::fs::write(dir.join(META_FILE), serde_json::to_string(&meta).unwrap()).unwrap();
    let tokens = std::fs::read(dir.join(TOKENS_FILE)).unwrap();
    std::fs::write(dir.join(TOKENS_FILE), &tokens[..tokens.len() - 1]).unwrap();
    assert!(matches!(Dataset::open(&dir), Err(PrerouterError::Corrupt { .. })), "a short token file");
    std::fs::write(dir.join(TOKENS_FILE), &tokens).unwrap();
    let bytes = std::fs::read(dir.join(HIDDEN_FILE)).unwrap();
    std::fs::write(dir.join(HIDDEN_FILE), &bytes[..bytes.len() - 4]).unwrap();
    assert!(matches!(Dataset::open(&dir), Err(PrerouterError::Corrupt { .. })));
}

/// A sequence repeating a fixed cycle of distinct tokens: token t determines token t+1, and
/// the fixtures route by token id, so the next layer's routing at t+1 is learnable from t.
fn periodic_tokens(n: usize, period: usize, vocab: usize) -> Vec<u32> {
    let mut rng = SplitMix64::new(5);
    let mut cycle: Vec<u32> = (1..vocab as u32).collect();
    for i in (1..cycle.len()).rev() {
        cycle.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    (0..n).map(|i| cycle[i % period]).collect()
}

fn collect_fixture(name: &str, dir: &Path, tokens: &[u32]) -> (Engine, DatasetMeta) {
    let engine = Engine::load_on(
        gpu(),
        &EngineOptions { kv_dtype: KvDtype::F32, ..EngineOptions::new(fixture(name)).with_format(WeightFormat::F32) },
    )
    .unwrap();
    let meta = collect(&engine, tokens, dir, 160).unwrap();
    (engine, meta)
}

#[test]
fn collect_is_exact_and_training_beats_baselines() {
    let dir = scratch("qwen3_moe");
    let tokens = periodic_tokens(481, 24, 384);
    let (engine, meta) = collect_fixture("qwen3_moe", &dir, &tokens);
    assert_eq!((meta.tokens, meta.hidden, meta.experts, meta.top_k), (480, 64, 8, 3));
    assert_eq!(meta.moe_layers, vec![0, 2]);
    // The observer is gone and left the output as it was; scoring with one installed agrees.
    let plain = engine.score(&tokens[..40]).unwrap().logprobs;
    engine.set_observer(Some(Box::new(|_, _, _| {})));
    let observed = engine.score(&tokens[..40]).unwrap().logprobs;
    engine.set_observer(None);
    assert_eq!(plain, observed);

    let data = Dataset::open(&dir).unwrap();
    // Routing is a function of the token id: equal tokens have equal routing.
    assert_eq!(data.topk(3, 1), data.topk(3 + 24, 1));
    let dims = ModelDims::of(engine.spec()).unwrap();
    let routers = read_routers(&fixture("qwen3_moe"), &dims, &dir).unwrap();
    let opts =
        TrainOptions { inner: 32, epochs: 30, batch: 16, seed: 3, holdout: 0.2, threads: 2, ..TrainOptions::default() };
    let model = ModelTables::routers(routers.clone());
    let (heads, report) = train(&data, &model, &opts).unwrap();
    let l = &report.layers[0];
    assert_eq!((l.layer, l.target_layer), (0, 2));
    eprintln!("qwen3_moe periodic trace: {l:?}");
    assert!(l.recall >= 0.95, "trained recall {}", l.recall);
    assert!(l.recall > l.persistence.recall && l.recall > l.router.recall, "{l:?}");
    // Deterministic for a seed.
    let (again, _) = train(&data, &model, &opts).unwrap();
    assert_eq!(heads, again);

    // Heads file round trip, model check, and typed errors.
    let file = dir.join("heads.safetensors");
    let mut saved = Heads::new(&dims, Features::EDGE0, 32, heads);
    saved.metrics = Some(serde_json::to_string(&report).unwrap());
    saved.save(&file).unwrap();
    let loaded = Heads::load(&file).unwrap();
    assert_eq!(loaded, saved);
    dims.check(&loaded.config.dims(), &file).unwrap();
    // `prerouter eval`'s scoring of the saved heads on the held-out samples gives the training
    // report's figures; no sample is an error.
    let (_, held_out) = split_held_out(&data, opts.holdout);
    let eval = evaluate(&data, &loaded, &model, &held_out, 2).unwrap();
    let e = &eval.layers[0];
    assert_eq!((eval.layers.len(), e.layer, e.target_layer), (1, 0, 2));
    let s = e.score;
    assert_eq!(
        (s.samples, s.head.recall, s.head.exact_match, s.recall_2k),
        (l.test_samples, l.recall, l.exact_match, l.recall_2k)
    );
    assert_eq!((s.persistence, s.router), (l.persistence, l.router));
    assert!(matches!(evaluate(&data, &loaded, &model, &[], 2), Err(PrerouterError::InvalidArgument(_))));
    let mixtral = ModelDims::of(&ArchSpec::from_dir(&fixture("mixtral")).unwrap()).unwrap();
    assert!(matches!(mixtral.check(&loaded.config.dims(), &file), Err(PrerouterError::Mismatch { .. })));
    assert!(matches!(
        read_routers(&fixture("mixtral"), &dims, &dir),
        Err(PrerouterError::Mismatch { what: "experts" | "top_k" | "MoE layer count", .. })
    ));
    prefetch_hint_keeps_output_exact(&file, &tokens);
    // The trained head predicts this periodic text perfectly: routing and perplexity barely move.
    let PredictedRun { differs, ratio, .. } = predicted_routing_uses_exactly_the_predictions(&file, &tokens, &[]);
    assert!((ratio - 1.0).abs() < 0.02 && differs <= 2, "trained head: {differs} tokens differ, ratio {ratio}");
    // A random head predicts other experts than the router's: they are used all the same.
    let random_file = dir.join("random-heads.safetensors");
    let d = loaded.heads[0].head.dims;
    let mut random = Head::new(d, None, &mut SplitMix64::new(11));
    for w in &mut random.params.fc2_weight {
        *w = SplitMix64::new(w.to_bits() as u64).next_signed();
    }
    let trained = TrainedHead { head: random, ..loaded.heads[0].clone() };
    Heads::new(&dims, Features::EDGE0, 32, vec![trained]).save(&random_file).unwrap();
    let PredictedRun { differs, ratio, .. } =
        predicted_routing_uses_exactly_the_predictions(&random_file, &tokens, &[]);
    assert!(differs >= 20 && (ratio - 1.0).abs() > 0.01, "random head: {differs} tokens differ, ratio {ratio}");

    let bytes = std::fs::read(&file).unwrap();
    for bad in [&bytes[..bytes.len() / 2], &bytes[..5], b"not a safetensors file at all".as_slice()] {
        std::fs::write(&file, bad).unwrap();
        assert!(matches!(Heads::load(&file), Err(PrerouterError::Corrupt { .. })), "{} bytes", bad.len());
    }
}

/// `--prefetch prerouter` with a small slot budget generates what the resident model does, and
/// its predictions are used.
fn prefetch_hint_keeps_output_exact(heads: &Path, tokens: &[u32]) {
    let base = EngineOptions::new(fixture("qwen3_moe")).with_format(WeightFormat::F32);
    let options = GenerateOptions { max_tokens: 24, ignore_eos: true, ..GenerateOptions::default() };
    let prompt = &tokens[..30];
    let resident = Engine::load_on(gpu(), &base).unwrap().generate(prompt, &options, |_, _| true).unwrap();
    let streaming = EngineOptions {
        budget: ExpertBudget::Slots(6),
        policy: PolicyKind::Lru,
        prefetch: PrefetchKind::Prerouter,
        prerouter: Some(heads.to_path_buf()),
        ..base.clone()
    };
    for prefetch in [PrefetchKind::Prerouter, PrefetchKind::PrerouterEamc] {
        let engine = Engine::load_on(gpu(), &EngineOptions { prefetch, ..streaming.clone() }).unwrap();
        let streamed = engine.generate(prompt, &options, |_, _| true).unwrap();
        assert_eq!(streamed.tokens, resident.tokens, "{prefetch}");
        let stats = streamed.stats.experts;
        eprintln!("{prefetch} prefetch: {stats:?}");
        assert!(stats.prefetch_issued > 0 && stats.prefetch_used > 0, "{prefetch}: {stats:?}");
    }
    let missing = Engine::load_on(gpu(), &EngineOptions { prerouter: None, ..streaming.clone() });
    assert!(matches!(missing, Err(moestream::Error::InvalidArgument(_))));
    let other_model = EngineOptions { model_dir: fixture("olmoe"), ..streaming.clone() };
    let refused = Engine::load_on(gpu(), &other_model).err().expect("heads of another model must be refused");
    assert!(refused.to_string().contains("was made for a model with"), "{refused}");
    let truncated = heads.with_extension("truncated");
    let bytes = std::fs::read(heads).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    let corrupt = Engine::load_on(gpu(), &EngineOptions { prerouter: Some(truncated), ..streaming });
    assert!(matches!(corrupt, Err(moestream::Error::Corrupt { .. })), "a truncated heads file is a corrupt-file error");
}

/// What an observer saw: per call, the MoE layer, its `hn` rows and routed ids.
type Seen = Arc<Mutex<Vec<(usize, Vec<f32>, Vec<u32>)>>>;

fn observe(engine: &Engine) -> Seen {
    let seen: Seen = Arc::default();
    let sink = seen.clone();
    engine.set_observer(Some(Box::new(move |layer, hn, ids| {
        sink.lock().unwrap().push((layer, hn.to_vec(), ids.to_vec()));
    })));
    seen
}

/// What predicted routing did to layer 2 of a text against native routing.
struct PredictedRun {
    /// Tokens whose layer-2 routing differs from native.
    differs: usize,
    /// Share of native layer-2 experts among those routed to.
    recall: f64,
    /// Perplexity predicted / native.
    ratio: f64,
}

/// `--routing predicted`: the first token and the head-less layer 0 route natively; from the
/// second token on, layer 2 routes to exactly the experts the CPU head predicts from the token
/// before (its FFN input at layer 0 and layer 2's routing at t−1 and t−2), and from the token
/// itself for heads reading its input embedding (`embeddings`, with the `token` feature).
fn predicted_routing_uses_exactly_the_predictions(file: &Path, tokens: &[u32], embeddings: &[f32]) -> PredictedRun {
    let base = EngineOptions::new(fixture("qwen3_moe")).with_format(WeightFormat::F32);
    let text = &tokens[..40];
    let native = Engine::load_on(gpu(), &base).unwrap();
    let native_seen = observe(&native);
    let native_score = native.score(text).unwrap();
    let options =
        EngineOptions { routing: RoutingMode::Predicted, prerouter: Some(file.to_path_buf()), ..base.clone() };
    let engine = Engine::load_on(gpu(), &options).unwrap();
    let seen = observe(&engine);
    let predicted_score = engine.score(text).unwrap();
    // Streamed through 6 slots with the predictions prefetched (and the routing of predicted
    // layers taken from them, with no readback), the log-probs are the resident ones.
    let streaming = EngineOptions {
        budget: ExpertBudget::Slots(6),
        policy: PolicyKind::Lru,
        prefetch: PrefetchKind::Prerouter,
        ..options.clone()
    };
    let streamed = Engine::load_on(gpu(), &streaming).unwrap().score(text).unwrap();
    assert_eq!(streamed.logprobs, predicted_score.logprobs, "streamed predicted routing == resident");
    assert!(streamed.experts.prefetch_used > 0, "{:?}", streamed.experts);

    let heads = Heads::load(file).unwrap();
    let head = &heads.heads[0];
    let (k, e) = (heads.config.top_k, heads.config.experts);
    let seen = seen.lock().unwrap();
    // One-token steps: per token, layer 0 then layer 2.
    assert_eq!(seen.len(), 2 * (text.len() - 1));
    let layer0: Vec<&(usize, Vec<f32>, Vec<u32>)> = seen.iter().filter(|s| s.0 == 0).collect();
    let layer2: Vec<Vec<u16>> =
        seen.iter().filter(|s| s.0 == 2).map(|s| s.2.iter().map(|&x| x as u16).collect()).collect();
    // Layer 0 has no head: its routing is the native one, token by token.
    let native_seen = native_seen.lock().unwrap();
    let native0: Vec<u32> = native_seen.iter().filter(|s| s.0 == 0).flat_map(|s| s.2.clone()).collect();
    let native2: Vec<u32> = native_seen.iter().filter(|s| s.0 == 2).flat_map(|s| s.2.clone()).collect();
    assert_eq!(layer0.iter().flat_map(|s| s.2.clone()).collect::<Vec<u32>>(), native0);
    assert_eq!(layer2[0].iter().map(|&x| u32::from(x)).collect::<Vec<u32>>(), native2[..k].to_vec(), "first token");
    let mut tape = Tape::default();
    let mut logits = vec![0f32; e];
    let (mut differs, mut matched) = (0, 0);
    let hidden = layer0[0].1.len();
    for t in 1..layer2.len() {
        let ctx = RoutingContext { next: &layer2[t - 1], prev: (t >= 2).then(|| layer2[t - 2].as_slice()), own: &[] };
        let mut x = layer0[t - 1].1.clone();
        if heads.config.features.token {
            let token = text[t] as usize;
            x.extend_from_slice(&embeddings[token * hidden..(token + 1) * hidden]);
        }
        head.head.forward(&x, &heads.config.features.active(e, &ctx), &mut tape, &mut logits);
        // As sets: the order of near-equal scores may differ between the GPU's f32 and the
        // CPU's f64 GELU.
        let sorted = |mut v: Vec<u16>| {
            v.sort_unstable();
            v
        };
        let (got, want) = (sorted(layer2[t].clone()), sorted(top_k(&logits, k)));
        assert_eq!(got, want, "token {t}: layer 2 routes to the predicted experts; CPU scores {logits:?}");
        let native_set: Vec<u16> = native2[t * k..(t + 1) * k].iter().map(|&x| x as u16).collect();
        differs += usize::from(layer2[t].iter().any(|x| !native_set.contains(x)));
        matched += layer2[t].iter().filter(|x| native_set.contains(x)).count();
    }
    let ratio = predicted_score.perplexity / native_score.perplexity;
    let recall = matched as f64 / ((layer2.len() - 1) * k) as f64;
    eprintln!(
        "predicted routing: {differs} of {} tokens differ from native, recall {recall:.3}; perplexity ratio {ratio}",
        layer2.len()
    );
    let missing = Engine::load_on(gpu(), &EngineOptions { prerouter: None, ..options });
    assert!(matches!(missing, Err(moestream::Error::InvalidArgument(_))));
    PredictedRun { differs, recall, ratio }
}

/// Heads reading the next token (feature `token`): on random text, where nothing before token
/// t+1 tells what it is, the token's embedding lifts the recall of its routing well above what
/// the context gives (768 training samples of 383 token ids); `prerouter eval` scores them; on
/// the GPU they run before each one-token step, as the routing (exactly the CPU heads'
/// prediction, streamed = resident) and as the prefetcher's hint; a dataset without token ids
/// is refused.
#[test]
fn the_next_tokens_embedding_predicts_its_routing() {
    let dir = scratch("qwen3_moe_random");
    let mut rng = SplitMix64::new(9);
    let tokens: Vec<u32> = (0..961).map(|_| 1 + (rng.next_u64() % 383) as u32).collect();
    let (engine, _) = collect_fixture("qwen3_moe", &dir, &tokens);
    let data = Dataset::open(&dir).unwrap();
    assert_eq!(data.token(7), Some(tokens[7]));
    let dims = ModelDims::of(engine.spec()).unwrap();
    let base =
        TrainOptions { inner: 32, epochs: 30, batch: 16, seed: 3, holdout: 0.2, threads: 2, ..TrainOptions::default() };
    let recall = |features: &str| {
        let opts = TrainOptions { features: features.parse().unwrap(), ..base };
        let model = ModelTables::read(&fixture("qwen3_moe"), &dims, &dir, opts.features.token).unwrap();
        let (heads, report) = train(&data, &model, &opts).unwrap();
        (heads, report.layers[0].recall, model)
    };
    let (plain_heads, without, _) = recall("next,prev");
    let (heads, with, model) = recall("next,prev,token");
    eprintln!("random text, recall@3: {without:.3} without the next token, {with:.3} with it");
    assert!(with > without + 0.15, "with {with}, without {without}");
    // `prerouter eval` scores the same figures on the held-out samples.
    let saved = Heads::new(&dims, "next,prev,token".parse().unwrap(), 32, heads);
    let (_, held_out) = split_held_out(&data, base.holdout);
    let eval = evaluate(&data, &saved, &model, &held_out, 2).unwrap();
    assert!((eval.layers[0].score.head.recall - with).abs() < 1e-12);
    assert!(
        evaluate(&data, &saved, &ModelTables::routers(model.routers.clone()), &held_out, 2).is_err(),
        "no embeddings"
    );
    // On the GPU, as the routing: closer to the native routing than heads without the token.
    let file = dir.join("token-heads.safetensors");
    saved.save(&file).unwrap();
    let plain_file = dir.join("plain-heads.safetensors");
    Heads::new(&dims, "next,prev".parse().unwrap(), 32, plain_heads).save(&plain_file).unwrap();
    let with_token =
        predicted_routing_uses_exactly_the_predictions(&file, &tokens, model.embeddings.as_deref().unwrap());
    let plain = predicted_routing_uses_exactly_the_predictions(&plain_file, &tokens, &[]);
    // (The random fixture's perplexity says nothing about routing quality: not compared.)
    assert!(
        with_token.recall > plain.recall + 0.1,
        "layer-2 recall against native {:.3} with the token, {:.3} without",
        with_token.recall,
        plain.recall
    );
    // As the prefetcher's hint under exact routing.
    prefetch_hint_keeps_output_exact(&file, &tokens);
    // A dataset collected before token ids were recorded (version 1) cannot train them.
    let meta = DatasetMeta { version: 1, ..data.meta.clone() };
    std::fs::write(dir.join(META_FILE), serde_json::to_string(&meta).unwrap()).unwrap();
    let old = Dataset::open(&dir).unwrap();
    let err =
        train(&old, &model, &TrainOptions { features: "next,prev,token".parse().unwrap(), ..base }).err().unwrap();
    assert!(err.to_string().contains("token ids"), "{err}");
}
