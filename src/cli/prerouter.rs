//! `moestream prerouter collect|train|eval`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::model_args::ModelArgs;
use moestream::prerouter::compat::ModelDims;
use moestream::prerouter::dataset::Dataset;
use moestream::prerouter::eval::{evaluate, EvalReport};
use moestream::prerouter::features::Features;
use moestream::prerouter::heads_file::{Heads, HEADS_FILE};
use moestream::prerouter::loss::Loss;
use moestream::prerouter::routers::ModelTables;
use moestream::prerouter::samples::sample_tokens;
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
    /// Score trained heads on a text they were not trained on: recall@k per layer against the
    /// persistence and router baselines.
    Eval(EvalArgs),
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
    /// Inputs besides the hidden state: any of next, prev, own (multi-hot routing), deep (the
    /// last MoE layer's hidden state), token (the next token's embedding; `prerouter eval`
    /// only, not run on the GPU yet), or none.
    #[arg(long, default_value = "next,prev")]
    features: String,
    /// Loss: ce (softmax cross-entropy over experts) or bce (multi-label binary).
    #[arg(long, default_value = "ce")]
    loss: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Flags of `prerouter eval`.
#[derive(Args, Debug)]
struct EvalArgs {
    /// The model, and with `--prerouter FILE` the heads (default: the model directory's
    /// `prerouter.safetensors`).
    #[command(flatten)]
    model: ModelArgs,
    /// Held-out text to teacher-force and score on.
    #[arg(long)]
    file: PathBuf,
    /// Score at most this many tokens.
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Tokens per teacher-forced sequence (capped to the context).
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// Keep the collected routing in this dataset directory (default: a temporary one, removed).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `prerouter`.
pub fn run(a: PrerouterArgs) -> Result<()> {
    match a.command {
        PrerouterCommand::Collect(c) => run_collect(c),
        PrerouterCommand::Train(t) => run_train(t),
        PrerouterCommand::Eval(e) => run_eval(e),
    }
}

/// The tokens of `file` (at most `max` recorded, plus the last one's target).
fn text_tokens(engine: &moestream::Engine, file: &Path, max: Option<usize>) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(file).map_err(|e| Error::io(file, e))?;
    let mut tokens = engine.encode(&text)?;
    if let Some(max) = max {
        tokens.truncate(max.saturating_add(1));
    }
    Ok(tokens)
}

fn run_collect(a: CollectArgs) -> Result<()> {
    let engine = a.model.load()?;
    let tokens = text_tokens(&engine, &a.file, a.max_tokens)?;
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
    let dims = data.meta.dims();
    let features: Features = a.features.parse()?;
    let model = ModelTables::read(&a.model, &dims, &a.data, features.token)?;
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
    let (trained, report) = train(&data, &model, &opts)?;
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

fn run_eval(a: EvalArgs) -> Result<()> {
    let dir = a.model.dir();
    let heads_path = a.model.prerouter.clone().unwrap_or_else(|| dir.join(HEADS_FILE));
    if !heads_path.exists() {
        return Err(Error::InvalidArgument(format!(
            "no prerouter heads at {}; pass --prerouter FILE (from `prerouter train`)",
            heads_path.display()
        )));
    }
    let heads = Heads::load(&heads_path)?;
    // The heads are scored here on the CPU; the engine only teacher-forces the text.
    let engine = moestream::Engine::load(&moestream::EngineOptions { prerouter: None, ..a.model.options()? })?;
    ModelDims::of(engine.spec())?.check(&heads.config.dims(), &heads_path)?;
    let tokens = text_tokens(&engine, &a.file, a.max_tokens)?;
    let (data_dir, temporary) = match &a.data {
        Some(d) => (d.clone(), false),
        None => (std::env::temp_dir().join(format!("moestream-prerouter-eval-{}", std::process::id())), true),
    };
    let collected = collect(&engine, &tokens, &data_dir, a.window);
    drop(engine);
    let report = collected.map_err(Error::from).and_then(|meta| {
        let data = Dataset::open(&data_dir)?;
        let model = ModelTables::read(&dir, &meta.dims(), &data_dir, heads.config.features.token)?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(evaluate(&data, &heads, &model, &sample_tokens(&data), threads)?)
    });
    if temporary {
        // Best effort: a leftover temporary directory is not worth failing the report for.
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    let report = report?;
    if a.json {
        println!("{}", serde_json::to_string(&report).expect("serialisable"));
    } else {
        print_eval(&report, &a.file, &heads_path);
    }
    Ok(())
}

fn print_eval(r: &EvalReport, file: &Path, heads: &Path) {
    println!("{} tokens of {}, heads {}", r.tokens, file.display(), heads.display());
    let k = r.top_k;
    println!(
        "{:>9} {:>7} {:>9} {:>8} {:>9} {:>8} {:>8}",
        "layer",
        "samples",
        format!("recall@{k}"),
        "exact",
        format!("rec@{}", 2 * k),
        "persist",
        "router"
    );
    for l in &r.layers {
        let s = &l.score;
        println!(
            "{:>4}→{:<4} {:>7} {:>9.4} {:>8.4} {:>9.4} {:>8.4} {:>8.4}",
            l.layer,
            l.target_layer,
            s.samples,
            s.head.recall,
            s.head.exact_match,
            s.recall_2k,
            s.persistence.recall,
            s.router.recall
        );
    }
    println!(
        "mean recall@{k} {:.4} (exact {:.4}, recall@{} {:.4}); baselines: persistence {:.4}, router {:.4}",
        r.mean_recall,
        r.mean_exact_match,
        2 * k,
        r.mean_recall_2k,
        r.mean_persistence_recall,
        r.mean_router_recall
    );
}
