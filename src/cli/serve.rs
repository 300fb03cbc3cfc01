//! `moestream serve`.

use clap::Args;

use super::model_args::{DraftArgs, ModelArgs};
use moestream::gpu::memory::parse_bytes;
use moestream::runtime::EngineOptions;
use moestream::serve::ServeOptions;
use moestream::{Error, Result};

/// Flags of `serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on (the default accepts connections from this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1 requests (default: env MOESTREAM_API_KEY, else none).
    #[arg(long, env = "MOESTREAM_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Largest request body accepted, e.g. `1MiB`.
    #[arg(long, value_parser = parse_bytes, default_value = "1MiB")]
    max_body: u64,
    /// A Jinja chat template to use instead of the model's (needed for chat on a model without one).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<std::path::PathBuf>,
    /// Requests answered at once, each with its own KV cache, sharing every step (default: 4
    /// where memory allows, else fewer).
    #[arg(long, short = 'P', value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    parallel: Option<u32>,
    /// Where a thinking model's `<think>` reasoning goes: `auto` keeps it apart from the answer
    /// (`reasoning_content`, as llama-server and vLLM), `none` leaves it in the content.
    #[arg(long, value_enum, default_value = "auto")]
    reasoning_format: ReasoningFormat,
    #[command(flatten)]
    drafts: DraftArgs,
}

/// `--reasoning-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ReasoningFormat {
    Auto,
    None,
}

/// Runs `serve` until Ctrl-C.
pub fn run(a: ServeArgs) -> Result<()> {
    let max_body_bytes =
        usize::try_from(a.max_body).map_err(|_| Error::InvalidArgument("--max-body is too large".into()))?;
    let plan = a.drafts.for_serve(a.model.routing.mode())?;
    let options = ServeOptions {
        host: a.host,
        port: a.port,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        max_body_bytes,
        chat_template: a.chat_template,
        parallel: a.parallel.map(|n| n as usize),
        split_reasoning: a.reasoning_format == ReasoningFormat::Auto,
        drafts: plan.lookup,
        mtp_drafts: plan.mtp,
    };
    moestream::serve::run(EngineOptions { mtp: a.drafts.mtp_load(), ..a.model.options()? }, options)
}
