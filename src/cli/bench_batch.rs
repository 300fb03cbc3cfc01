//! `moestream bench batch`: many requests at once through the scheduler.

use clap::Args;

use super::bench::print_json;
use super::model_args::ModelArgs;
use moestream::bench::batch::{self, BatchBenchOptions};
use moestream::runtime::MtpLoad;
use moestream::Result;

/// Flags of `bench batch`.
#[derive(Args, Debug)]
pub struct BatchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Counts of requests submitted together, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    requests: Vec<usize>,
    /// Prompt length of each request (seeded random ids, different per request).
    #[arg(long, default_value_t = 16)]
    prompt_tokens: usize,
    /// Tokens each request generates (end-of-sequence ignored).
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// Timed rounds after a warm-up round (each round runs every count once, in turn).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seed of the prompts' ids.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also run every count with N MTP drafts a step (the model's MTP module) against none,
    /// round by round in turn. 0 = not.
    #[arg(long, value_name = "N", default_value_t = 0)]
    mtp_drafts: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs `bench batch`.
pub fn run(a: BatchArgs) -> Result<()> {
    let mut options = a.model.options()?;
    options.parallel = a.requests.iter().copied().max().unwrap_or(1);
    if a.mtp_drafts > 0 {
        options.mtp = MtpLoad::Required;
    }
    let engine = moestream::Engine::load(&options)?;
    let o = BatchBenchOptions {
        requests: a.requests.clone(),
        prompt_tokens: a.prompt_tokens,
        decode_tokens: a.decode_tokens,
        runs: a.runs,
        seed: a.seed,
        mtp_drafts: a.mtp_drafts,
    };
    let r = batch::run(&engine, &o)?;
    if a.json {
        print_json(&r);
        return Ok(());
    }
    let slots = r.expert_slots.map_or("every expert resident".to_string(), |s| format!("{s} expert slots"));
    println!(
        "{} on {}, {slots}: requests of {} prompt tokens generating {} each\n",
        r.model, r.adapter, r.prompt_tokens, r.decode_tokens
    );
    print!("{}", r.markdown());
    Ok(())
}
