//! `moestream bench paths`: every switchable fast path against the plain path it replaces.

use std::path::PathBuf;

use clap::Args;

use super::bench::print_json;
use super::model_args::ModelArgs;
use moestream::bench::paths::{self, PathsBenchOptions, PathsReport};
use moestream::{Error, Result};

/// Flags of `bench paths`.
#[derive(Args, Debug)]
pub struct PathsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length (seeded random token ids).
    #[arg(long, default_value_t = 32)]
    prompt_tokens: usize,
    /// Tokens generated per run (greedy, end-of-sequence ignored).
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// Runs of each path, in turn, after one warm-up of each.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seed of the prompt's ids.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Only these paths (comma-separated names, as the table lists them).
    #[arg(long, value_delimiter = ',')]
    paths: Option<Vec<String>>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the JSON object to this file (`.ci/run` keeps it beside the printed table).
    #[arg(long, value_name = "FILE")]
    json_file: Option<PathBuf>,
}

/// Runs `bench paths`: prints the table (or JSON), writes `--json-file`, and fails when a path
/// regressed.
pub fn run(a: PathsArgs) -> Result<()> {
    let o = PathsBenchOptions {
        prompt_tokens: a.prompt_tokens,
        decode_tokens: a.decode_tokens,
        runs: a.runs,
        seed: a.seed,
        only: a.paths,
    };
    let r = paths::run(&a.model.options()?, &o)?;
    match a.json {
        true => print_json(&r),
        false => print_paths(&r),
    }
    if let Some(file) = &a.json_file {
        let json = serde_json::to_string_pretty(&r).expect("serialisable");
        std::fs::write(file, json + "\n").map_err(|e| Error::io(file, e))?;
    }
    let regressed: Vec<&str> = r.paths.iter().filter(|p| p.regressed()).map(|p| p.name).collect();
    match regressed.is_empty() {
        true => Ok(()),
        false => Err(Error::InvalidArgument(format!(
            "fast paths slower than their plain paths by more than {}x in every run: {}",
            r.slower_limit,
            regressed.join(", ")
        ))),
    }
}

fn print_paths(r: &PathsReport) {
    println!(
        "{} on {}: {} prompt + {} generated tokens, {} runs of each path in turn (fast / plain tok/s, median ratio and range)",
        r.model, r.adapter, r.prompt_tokens, r.decode_tokens, r.runs
    );
    println!("{:<18} {:>28} {:>28}  plain path", "path", "prefill fast/plain", "decode fast/plain");
    let phase = |p: &paths::PhaseComparison| {
        let (lo, hi) = p.ratios.iter().fold((f64::MAX, 0f64), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        let flag = if p.slower_beyond_limit { " SLOWER" } else { "" };
        format!("{:.2}x ({lo:.2}-{hi:.2}){flag}", p.median_ratio)
    };
    for p in &r.paths {
        match (&p.prefill, &p.decode, &p.not_compared) {
            (Some(pre), Some(dec), _) => println!("{:<18} {:>28} {:>28}  {}", p.name, phase(pre), phase(dec), p.plain),
            (_, _, why) => println!("{:<18} not compared: {}", p.name, why.as_deref().unwrap_or("")),
        }
    }
}
