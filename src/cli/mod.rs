//! Subcommands and their flags (the stable CLI contract).

mod bench;
mod bench_batch;
mod bench_kv_size;
mod bench_model;
mod bench_paths;
mod chat;
mod chat_input;
mod convert;
mod devices;
mod generate;
mod info;
mod model_args;
mod prerouter;
mod score;
#[cfg(feature = "serve")]
mod serve;
mod simulate;
mod trace_stats;

use clap::{Parser, Subcommand};

use moestream::Result;

/// A command whose output is cut short (`moestream info --json | head -1`, `generate | head -c
/// 20`) ends there, quietly, as other command-line tools do: Rust ignores SIGPIPE, so a write to
/// a closed pipe would otherwise panic in `println!` or keep generating into nothing. The server
/// keeps Rust's default (a client that goes away must not end it).
#[cfg(unix)]
fn quiet_on_closed_stdout() {
    // SAFETY: setting a signal's disposition to the default has no preconditions; it runs before
    // any other thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn quiet_on_closed_stdout() {}

/// Run mixture-of-experts language models on any GPU, streaming experts from SSD.
#[derive(Parser)]
#[command(name = "moestream", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text after a prompt, streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Chat with an instruct model in the terminal (the model's chat template; works piped).
    Chat(chat::ChatArgs),
    /// Serve an OpenAI-compatible HTTP API (chat and text completions, streaming).
    #[cfg(feature = "serve")]
    Serve(serve::ServeArgs),
    /// Teacher-force a sequence: per-token log-probs and perplexity.
    Score(score::ScoreArgs),
    /// Describe a model: architecture, sizes, experts.
    Info(info::InfoArgs),
    /// List GPU adapters with backend, type, features and limits.
    Devices(devices::DevicesArgs),
    /// Convert a Hugging Face checkpoint into a moestream model directory (int4/f16).
    Convert(convert::ConvertArgs),
    /// Measure kernel and end-to-end speed.
    Bench(bench::BenchArgs),
    /// Replay a routing trace under cache policies (LRU, LFU, EAMC, Belady's optimum).
    Simulate(simulate::SimulateArgs),
    /// Expert-activation statistics of a routing trace.
    TraceStats(trace_stats::TraceStatsArgs),
    /// Collect data for, and train, the prerouter heads.
    Prerouter(prerouter::PrerouterArgs),
}

/// Parses the command line and runs the chosen subcommand.
pub fn run() -> Result<()> {
    let cli = Cli::parse();
    #[cfg(feature = "serve")]
    let serves = matches!(cli.command, Command::Serve(_));
    #[cfg(not(feature = "serve"))]
    let serves = false;
    if !serves {
        quiet_on_closed_stdout();
    }
    match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        #[cfg(feature = "serve")]
        Command::Serve(a) => serve::run(a),
        Command::Score(a) => score::run(a),
        Command::Info(a) => info::run(a),
        Command::Devices(a) => devices::run(a),
        Command::Convert(a) => convert::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::TraceStats(a) => trace_stats::run(a),
        Command::Prerouter(a) => prerouter::run(a),
    }
}

#[cfg(test)]
mod tests {
    /// No two flags of a command share a short letter or a long name (clap checks this only in
    /// debug builds, and the tests run in release).
    #[test]
    fn no_two_flags_share_a_name() {
        use clap::CommandFactory;
        fn check(cmd: &clap::Command, path: &str) {
            let (mut shorts, mut longs) = (std::collections::HashSet::new(), std::collections::HashSet::new());
            for arg in cmd.get_arguments() {
                for short in arg.get_short_and_visible_aliases().into_iter().flatten() {
                    assert!(shorts.insert(short), "{path}: -{short} twice");
                }
                for long in arg.get_long_and_visible_aliases().into_iter().flatten() {
                    assert!(longs.insert(long.to_string()), "{path}: --{long} twice");
                }
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()));
            }
        }
        check(&super::Cli::command(), "moestream");
    }
}
