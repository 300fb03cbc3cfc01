//! `moestream bench kv-size`: one sequence's cache bytes from a model's architecture alone.

use std::path::PathBuf;

use clap::Args;

use super::bench::print_json;
use super::model_args::{check_exists, default_model};
use moestream::bench::kv_size;
use moestream::runtime::options::DEFAULT_MAX_BATCH;
use moestream::Result;

/// Flags of `bench kv-size`.
#[derive(Args, Debug)]
pub struct KvSizeArgs {
    /// Model directory (config.json) or GGUF file; defaults to the bundled model.
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Contexts (positions per sequence), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "32768,131072")]
    contexts: Vec<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `bench kv-size`.
pub fn run(a: KvSizeArgs) -> Result<()> {
    let path = a.model.unwrap_or_else(default_model);
    check_exists(&path)?;
    let spec = moestream::model::gguf::arch::spec_at(&path)?;
    let r = kv_size::run(&spec, &path.display().to_string(), &a.contexts, DEFAULT_MAX_BATCH);
    if a.json {
        print_json(&r);
        return Ok(());
    }
    println!("{} ({}): one sequence's caches, rings of window + {}\n", r.model, r.architecture, r.max_step - 1);
    print!("{}", r.markdown());
    Ok(())
}
