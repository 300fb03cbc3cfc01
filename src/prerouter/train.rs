//! Training the heads on a dataset, and scoring them on held-out tokens against two baselines.
//!
//! The head owned by MoE layer N (`j` in the dataset's MoE-layer order) learns to predict layer
//! N+1's routed set at token t+1 from token t. Samples pair tokens of one sequence only. The
//! last `holdout` share of tokens is held out; on it the report gives recall@k and exact-set
//! match of the trained head and of two baselines: *persistence* (layer N+1's routing at t) and
//! *router* (layer N+1's router applied to `h_N(t)`: the untrained skip). Training is
//! deterministic for a seed: each head has its own random stream, whatever the thread count.

use serde::Serialize;

use super::adam::Adam;
use super::dataset::Dataset;
use super::error::PrerouterError;
use super::features::Features;
use super::head::{Head, HeadDims, HeadParams, Tape};
use super::loss::Loss;
use super::parallel::map_in_threads;
use super::routers::ModelTables;
use super::samples::{split_held_out, token_inputs, HeadInputs};
pub use super::score::Score;
use super::score::{mean, score_head};
use crate::util::rng::SplitMix64;

/// How to train.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct TrainOptions {
    /// fc1's output width.
    pub inner: usize,
    /// Heads only for MoE layers with a model layer index at least this.
    pub start_layer: usize,
    /// Passes over the training samples.
    pub epochs: usize,
    /// Seed of initialisation and shuffling.
    pub seed: u64,
    /// Adam learning rate.
    pub lr: f32,
    /// Samples per update.
    pub batch: usize,
    /// Share of tokens (the last ones) held out for scoring.
    pub holdout: f64,
    /// Multi-hot inputs besides the hidden state.
    pub features: Features,
    /// Training loss.
    pub loss: Loss,
    /// Worker threads (heads train independently).
    pub threads: usize,
}

impl Default for TrainOptions {
    fn default() -> TrainOptions {
        TrainOptions {
            inner: 512,
            start_layer: 0,
            epochs: 4,
            seed: 0,
            lr: 1e-3,
            batch: 64,
            holdout: 0.1,
            features: Features::EDGE0,
            loss: Loss::Ce,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// One head's figures.
#[derive(Clone, Debug, Serialize)]
pub struct LayerReport {
    /// Model layer index of the MoE layer owning the head (N).
    pub layer: usize,
    /// Model layer index of the MoE layer it predicts (N+1).
    pub target_layer: usize,
    /// Training samples.
    pub train_samples: usize,
    /// Held-out samples.
    pub test_samples: usize,
    /// Trained head: recall@k on held-out samples.
    pub recall: f64,
    /// Trained head: exact-set match on held-out samples.
    pub exact_match: f64,
    /// Trained head: share of routed experts among its 2k best (a prefetch may load that many).
    pub recall_2k: f64,
    /// Baseline: layer N+1's routing at token t.
    pub persistence: Score,
    /// Baseline: layer N+1's router applied to `h_N(t)` (the skip before training).
    pub router: Score,
    /// Mean training loss of the last epoch.
    pub train_loss: f64,
}

/// Every head's figures and their means.
#[derive(Clone, Debug, Serialize)]
pub struct TrainReport {
    /// Per head, in layer order.
    pub layers: Vec<LayerReport>,
    /// Mean recall@k of the trained heads.
    pub mean_recall: f64,
    /// Mean exact-set match of the trained heads.
    pub mean_exact_match: f64,
    /// Mean recall@k of the persistence baseline.
    pub mean_persistence_recall: f64,
    /// Mean recall@k of the router baseline.
    pub mean_router_recall: f64,
    /// The options used.
    pub options: TrainOptions,
}

/// A trained head and the layers it links.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainedHead {
    /// Model layer index of the owning MoE layer (N).
    pub layer: usize,
    /// Model layer index of the predicted MoE layer (N+1).
    pub target_layer: usize,
    /// The head.
    pub head: Head,
}

/// One head's job: dataset MoE-layer index `j` predicts `j + 1`.
struct Job<'a> {
    inputs: HeadInputs<'a>,
    train: &'a [usize],
    test: &'a [usize],
    opts: &'a TrainOptions,
    skip: &'a [f32],
}

impl Job<'_> {
    fn run(self) -> (TrainedHead, LayerReport) {
        let (d, o, j) = (self.inputs.data, self.opts, self.inputs.j);
        let experts = d.meta.experts;
        let (hidden, features) = (d.meta.hidden, o.features);
        let dims = HeadDims {
            hidden,
            dense: features.dense_dim(hidden),
            sparse: features.sparse_dim(experts),
            inner: o.inner,
            experts,
        };
        let mut rng = SplitMix64::new(o.seed ^ (j as u64).wrapping_mul(0xA076_1D64_78BD_642F));
        let mut head = Head::new(dims, Some(self.skip), &mut rng);
        let mut adam = Adam::new(dims, o.lr);
        let mut grads = HeadParams::zeros(dims);
        let (mut tape, mut scratch) = (Tape::default(), Vec::new());
        let (mut logits, mut dlogits) = (vec![0f32; experts], vec![0f32; experts]);
        let mut order = self.train.to_vec();
        let mut train_loss = 0.0;
        for _ in 0..o.epochs {
            shuffle(&mut order, &mut rng);
            let mut total = 0.0;
            for batch in order.chunks(o.batch.max(1)) {
                grads.clear();
                for &t in batch {
                    let (x, active) = (self.inputs.dense(t), self.inputs.active(t));
                    head.forward(&x, &active, &mut tape, &mut logits);
                    total += f64::from(o.loss.eval(&logits, self.inputs.target(t), &mut dlogits));
                    head.backward(&x, &active, &tape, &dlogits, &mut grads, &mut scratch);
                }
                adam.step(&mut head.params, &grads, batch.len());
            }
            train_loss = total / order.len().max(1) as f64;
        }
        let score = score_head(&self.inputs, &head, self.skip, self.test);
        let (layer, target_layer) = (d.meta.moe_layers[j], d.meta.moe_layers[j + 1]);
        let report = LayerReport {
            layer,
            target_layer,
            train_samples: self.train.len(),
            test_samples: self.test.len(),
            recall: score.head.recall,
            exact_match: score.head.exact_match,
            recall_2k: score.recall_2k,
            persistence: score.persistence,
            router: score.router,
            train_loss,
        };
        (TrainedHead { layer, target_layer, head }, report)
    }
}

/// Fisher–Yates with `rng`.
fn shuffle(v: &mut [usize], rng: &mut SplitMix64) {
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

/// Trains one head per consecutive pair of MoE layers (owner at or after `start_layer`) on
/// `data`; `model` holds every MoE layer's router (`[experts, hidden]`, dataset order), the
/// skip's initial value, and with the `token` feature the input embeddings. Returns the heads in
/// layer order and their report.
pub fn train(
    data: &Dataset,
    model: &ModelTables,
    opts: &TrainOptions,
) -> Result<(Vec<TrainedHead>, TrainReport), PrerouterError> {
    let (m, routers) = (&data.meta, &model.routers);
    let embeddings = token_inputs(data, opts.features, model.embeddings.as_deref())?;
    if routers.len() != m.moe_layers.len() || routers.iter().any(|r| r.len() != m.experts * m.hidden) {
        return Err(PrerouterError::InvalidArgument("one [experts, hidden] router per MoE layer is needed".into()));
    }
    if !(0.0..1.0).contains(&opts.holdout) || opts.inner == 0 {
        return Err(PrerouterError::InvalidArgument("holdout must be in [0, 1) and the head width positive".into()));
    }
    let (train, test) = split_held_out(data, opts.holdout);
    let owners: Vec<usize> =
        (0..m.moe_layers.len().saturating_sub(1)).filter(|&j| m.moe_layers[j] >= opts.start_layer).collect();
    if owners.is_empty() {
        return Err(PrerouterError::InvalidArgument(format!(
            "no pair of consecutive MoE layers from layer {} on (MoE layers {:?})",
            opts.start_layer, m.moe_layers
        )));
    }
    if train.is_empty() || test.is_empty() {
        return Err(PrerouterError::InvalidArgument(format!(
            "{} tokens give {} training and {} held-out samples; both must be non-empty",
            m.tokens,
            train.len(),
            test.len()
        )));
    }
    let (heads, layers): (Vec<TrainedHead>, Vec<LayerReport>) = map_in_threads(owners.len(), opts.threads, |i| {
        let j = owners[i];
        let inputs = HeadInputs { data, j, features: opts.features, embeddings };
        Job { inputs, train: &train, test: &test, opts, skip: &routers[j + 1] }.run()
    })
    .into_iter()
    .unzip();
    let report = TrainReport {
        mean_recall: mean(layers.iter().map(|l| l.recall)),
        mean_exact_match: mean(layers.iter().map(|l| l.exact_match)),
        mean_persistence_recall: mean(layers.iter().map(|l| l.persistence.recall)),
        mean_router_recall: mean(layers.iter().map(|l| l.router.recall)),
        layers,
        options: *opts,
    };
    Ok((heads, report))
}
