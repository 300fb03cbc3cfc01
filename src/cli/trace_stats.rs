//! `moestream trace-stats`: how skewed and how reused a trace's expert activations are.

use std::path::PathBuf;

use clap::Args;

use moestream::experts::trace::Trace;
use moestream::sim;
use moestream::{Error, Result};

/// Flags of `trace-stats`.
#[derive(Args, Debug)]
pub struct TraceStatsArgs {
    /// Trace written by `generate --trace`.
    #[arg(long)]
    trace: PathBuf,
    /// Print JSON instead of a summary.
    #[arg(long)]
    json: bool,
    /// Also write a layers × experts activation heatmap (SVG).
    #[arg(long)]
    heatmap: Option<PathBuf>,
}

/// Runs `trace-stats`.
pub fn run(a: TraceStatsArgs) -> Result<()> {
    let trace = Trace::read(&a.trace)?;
    let stats = sim::trace_stats(&trace);
    if a.json {
        println!("{}", stats.to_json());
    } else {
        print!("{}", stats.summary());
    }
    if let Some(path) = &a.heatmap {
        std::fs::write(path, sim::heatmap_svg(&stats)).map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}
