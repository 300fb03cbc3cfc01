//! `moestream simulate`: replay a routing trace through the engine's own cache code.

use std::path::PathBuf;

use clap::Args;

use moestream::experts::eam::DEFAULT_EAMC_CAPACITY;
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::experts::trace::Trace;
use moestream::sim::{self, SimConfig};
use moestream::{Error, Result};

/// Flags of `simulate`.
#[derive(Args, Debug)]
pub struct SimulateArgs {
    /// Trace written by `generate --trace` / `score --trace`.
    #[arg(long)]
    trace: PathBuf,
    /// Capacities: slot counts and/or percentages of all experts, e.g. `10%,25%,50%` or `8,16`.
    #[arg(long)]
    slots: String,
    /// lru, lfu, eamc, s3fifo, arc, belady, or all (comma-separated list allowed).
    #[arg(long, default_value = "all")]
    policy: String,
    /// Prefetcher for the online policies (Belady is demand-only): none, eamc, or prerouter /
    /// prerouter+eamc on a trace recorded with `--prefetch prerouter` (it replays the heads'
    /// recorded predictions).
    #[arg(long, default_value = "none")]
    prefetch: String,
    /// Requests the EAMC collection remembers.
    #[arg(long, default_value_t = DEFAULT_EAMC_CAPACITY)]
    eamc_capacity: usize,
    /// Print `{"results":[...]}` instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write a hit-rate-vs-capacity plot (SVG).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// The trace switches task at this request: report how many requests EAMC needs to recover
    /// its hit rate (at the first capacity).
    #[arg(long)]
    shift_at: Option<usize>,
}

/// Runs `simulate`.
pub fn run(a: SimulateArgs) -> Result<()> {
    let trace = Trace::read(&a.trace)?;
    let h = &trace.header;
    let slots = sim::parse_capacities(&a.slots, h.total_experts(), h.top_k)?;
    let policies: Vec<PolicyKind> = if a.policy == "all" {
        PolicyKind::ALL.to_vec()
    } else {
        a.policy.split(',').map(str::parse).collect::<Result<_>>()?
    };
    let prefetch: PrefetchKind = a.prefetch.parse()?;
    let results = sim::simulate(&trace, &slots, &policies, prefetch, a.eamc_capacity)?;
    if a.json {
        println!("{}", sim::results_json(&results));
    } else {
        print!("{}", sim::results_table(&results));
    }
    if let Some(path) = &a.plot {
        std::fs::write(path, sim::plot_svg(&results)).map_err(|e| Error::io(path, e))?;
    }
    if let Some(shift_at) = a.shift_at {
        let config = SimConfig { slots: slots[0], policy: PolicyKind::Eamc, prefetch, eamc_capacity: a.eamc_capacity };
        let r = sim::workload_shift(&trace, shift_at, config, 3)?;
        match r.requests {
            Some(n) => eprintln!(
                "workload shift at request {shift_at}: EAMC back within 5% of its steady hit rate {:.3} after {n} requests",
                r.steady_state
            ),
            None => eprintln!("workload shift at request {shift_at}: EAMC did not recover within the trace"),
        }
    }
    Ok(())
}
