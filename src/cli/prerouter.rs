//! `moestream prerouter collect|train`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::model_args::ModelArgs;
use moestream::prerouter::compat::ModelDims;
use moestream::prerouter::dataset::Dataset;
use moestream::prerouter::features::Features;
use moestream::prerouter::heads_file::Heads;
use moestream::prerouter::loss::Loss;
use moestream::prerouter::routers::read_routers;
use moestream::prerouter::train::{train, TrainOptions, TrainReport};
use moestream::runtime::collect_routing::collect;
use moestream::{Error, Result};

/// Flags of `prerouter`.
#[derive(Args, Debug)]
pub struct PrerouterArgs {
    #[command(subcommand)]
    command: PrerouterCommand,
}

#[derive(Subcommand, Debug)]
enum PrerouterCommand {
    /// Teacher-force a text file and record every MoE layer's FFN input and routed experts.
    Collect(CollectArgs),
    /// Train the heads on a collected dataset and report recall against baselines.
    Train(TrainArgs),
}

/// Flags of `prerouter collect`.
#[derive(Args, Debug)]
struct CollectArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text file to teacher-force.
    #[arg(long)]
    file: PathBuf,
    /// Dataset directory to write (meta.json, hidden.f32, topk.u16).
    #[arg(long)]
    out: PathBuf,
    /// Record at most this many tokens.
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Tokens per teacher-forced sequence (capped to the context).
    #[arg(long, default_value_t = 512)]
    window: usize,
}

/// Flags of `prerouter train`.
#[derive(Args, Debug)]
struct TrainArgs {
    /// Dataset directory written by `prerouter collect`.
    #[arg(long)]
    data: PathBuf,
    /// The model the data was collected from (its routers initialise the skips).
    #[arg(long)]
    model: PathBuf,
    /// Heads file to write (safetensors).
    #[arg(long)]
    out: PathBuf,
    /// Width of each head's hidden layer (fc1's output).
    #[arg(long, default_value_t = 512)]
    hidden: usize,
    /// Train heads only for MoE layers from this model layer on.
    #[arg(long, default_value_t = 0)]
    start_layer: usize,
    /// Passes over the training samples (more overfits ~10k-token datasets).
    #[arg(long, default_value_t = 4)]
    epochs: usize,
    /// Seed of initialisation and shuffling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Adam learning rate.
    #[arg(long, default_value_t = 1e-3)]
    lr: f32,
    /// Samples per update.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Share of tokens (the last ones) held out for scoring.
    #[arg(long, default_value_t = 0.1)]
    holdout: f64,
    /// Multi-hot inputs besides the hidden state: any of next, prev, own (or none).
    #[arg(long, default_value = "next,prev")]
    features: String,
    /// Loss: ce (softmax cross-entropy over experts) or bce (multi-label binary).
    #[arg(long, default_value = "ce")]
    loss: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `prerouter`.
pub fn run(a: PrerouterArgs) -> Result<()> {
    match a.command {
        PrerouterCommand::Collect(c) => run_collect(c),
        PrerouterCommand::Train(t) => run_train(t),
    }
}

fn run_collect(a: CollectArgs) -> Result<()> {
    let engine = a.model.load()?;
    let text = std::fs::read_to_string(&a.file).map_err(|e| Error::io(&a.file, e))?;
    let mut tokens = engine.encode(&text)?;
    if let Some(max) = a.max_tokens {
        tokens.truncate(max.saturating_add(1));
    }
    let meta = collect(&engine, &tokens, &a.out, a.window)?;
    println!(
        "recorded {} tokens × {} MoE layers (hidden {}, top-{} of {}) into {}",
        meta.tokens,
        meta.moe_layers.len(),
        meta.hidden,
        meta.top_k,
        meta.experts,
        a.out.display()
    );
    Ok(())
}

fn run_train(a: TrainArgs) -> Result<()> {
    let data = Dataset::open(&a.data)?;
    let m = &data.meta;
    let dims = ModelDims { hidden: m.hidden, experts: m.experts, top_k: m.top_k, moe_layers: m.moe_layers.clone() };
    let routers = read_routers(&a.model, &dims, &a.data)?;
    let features: Features = a.features.parse()?;
    let opts = TrainOptions {
        inner: a.hidden,
        start_layer: a.start_layer,
        epochs: a.epochs,
        seed: a.seed,
        lr: a.lr,
        batch: a.batch,
        holdout: a.holdout,
        features,
        loss: a.loss.parse::<Loss>()?,
        ..TrainOptions::default()
    };
    let (trained, report) = train(&data, &routers, &opts)?;
    let json = serde_json::to_string(&report).expect("serialisable");
    let mut heads = Heads::new(&dims, features, a.hidden, trained);
    heads.metrics = Some(json.clone());
    heads.save(&a.out)?;
    if a.json {
        println!("{json}");
    } else {
        print_report(&report, &a.out);
    }
    Ok(())
}

fn print_report(r: &TrainReport, out: &Path) {
    println!(
        "{:>9} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "layer", "train", "test", "recall", "exact", "rec@2k", "persist", "router", "loss"
    );
    for l in &r.layers {
        println!(
            "{:>4}→{:<4} {:>7} {:>7} {:>8.4} {:>8.4} {:>8.4} {:>8.4} {:>8.4} {:>8.4}",
            l.layer,
            l.target_layer,
            l.train_samples,
            l.test_samples,
            l.recall,
            l.exact_match,
            l.recall_2k,
            l.persistence.recall,
            l.router.recall,
            l.train_loss
        );
    }
    println!(
        "mean recall@k {:.4} (exact {:.4}); baselines: persistence {:.4}, router {:.4}",
        r.mean_recall, r.mean_exact_match, r.mean_persistence_recall, r.mean_router_recall
    );
    println!("heads written to {}", out.display());
}
