//! `moestream score`.

use std::path::PathBuf;

use clap::Args;

use super::model_args::{parse_tokens, ModelArgs};
use moestream::{Error, Result};

/// Flags of `score`.
#[derive(Args, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Text to score.
    #[arg(long, group = "input", required_unless_present_any = ["tokens", "file"])]
    text: Option<String>,
    /// Comma-separated token ids to score.
    #[arg(long, group = "input")]
    tokens: Option<String>,
    /// A text file to score (truncated to the context).
    #[arg(long, group = "input")]
    file: Option<PathBuf>,
    /// Print JSON: {"tokens":[..],"logprobs":[..],"perplexity":..}.
    #[arg(long)]
    json: bool,
}

/// Runs `score`.
pub fn run(a: ScoreArgs) -> Result<()> {
    let engine = a.model.load()?;
    let tokens = match (&a.text, &a.tokens, &a.file) {
        (_, Some(t), _) => parse_tokens(t)?,
        (Some(t), _, _) => engine.encode(t)?,
        (_, _, Some(f)) => {
            let text = std::fs::read_to_string(f).map_err(|e| Error::io(f, e))?;
            let mut ids = engine.encode(&text)?;
            if ids.len() > engine.context() {
                eprintln!("note: {} tokens truncated to the context of {}", ids.len(), engine.context());
                ids.truncate(engine.context());
            }
            ids
        }
        _ => unreachable!("clap requires one input"),
    };
    let s = engine.score(&tokens)?;
    if a.json {
        println!("{}", serde_json::to_string(&s).expect("serialisable"));
    } else {
        for (i, lp) in s.logprobs.iter().enumerate() {
            println!("{:>6} {:>8} {:>10.4}", i + 1, s.tokens[i + 1], lp);
        }
        println!("perplexity {:.4} over {} tokens", s.perplexity, s.logprobs.len());
    }
    Ok(())
}
