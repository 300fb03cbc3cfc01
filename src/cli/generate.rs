//! `moestream generate`.

use std::io::Write;

use clap::Args;

use super::model_args::{parse_tokens, DraftArgs, ModelArgs, SamplingArgs};
use moestream::runtime::{Constraint, GenerateOptions};
use moestream::{Engine, Error, Result};

/// Flags of `generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text.
    #[arg(short, long, group = "input", required_unless_present_any = ["tokens", "prompt_file"])]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, group = "input")]
    tokens: Option<String>,
    /// Many requests, one prompt per non-empty line, run one after another on one engine (the
    /// expert cache and `--trace` see them as separate requests). With `--json`, one object per line.
    #[arg(long, group = "input")]
    prompt_file: Option<std::path::PathBuf>,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    drafts: DraftArgs,
    /// The text must be JSON valid against this schema (inline JSON, or a file holding it).
    #[arg(long, value_name = "SCHEMA|FILE", group = "constraint")]
    json_schema: Option<String>,
    /// The text must match this regular expression, whole.
    #[arg(long, value_name = "REGEX", group = "constraint")]
    regex: Option<String>,
    /// The text must follow this Lark grammar (llguidance's dialect; a file).
    #[arg(long, value_name = "FILE", group = "constraint")]
    grammar: Option<std::path::PathBuf>,
    /// Do not stop at end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    json: bool,
}

/// Runs `generate`.
pub fn run(a: GenerateArgs) -> Result<()> {
    a.sampling.validate()?;
    let constraint = constraint(&a)?;
    let engine = a.model.load_with(a.drafts.mtp_load())?;
    let drafts = a.drafts.plan(&engine, constraint.is_some())?;
    let prompts: Vec<(Option<String>, Vec<u32>)> = match (&a.prompt, &a.tokens, &a.prompt_file) {
        (_, Some(t), _) => vec![(None, parse_tokens(t)?)],
        (Some(p), _, _) => vec![(Some(p.clone()), engine.encode(p)?)],
        (_, _, Some(f)) => {
            let text = std::fs::read_to_string(f).map_err(|e| Error::io(f, e))?;
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(|l| Ok((Some(l.to_string()), engine.encode(l)?)))
                .collect::<Result<_>>()?
        }
        _ => unreachable!("clap requires one input"),
    };
    let options = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: a.sampling.sampling(&engine),
        ignore_eos: a.ignore_eos,
        drafts: drafts.lookup,
        mtp_drafts: drafts.mtp,
        constraint,
        ..Default::default()
    };
    for (text, prompt) in prompts {
        run_one(&engine, text.as_deref(), &prompt, &options, a.json)?;
    }
    Ok(())
}

/// The constraint the flags ask for.
fn constraint(a: &GenerateArgs) -> Result<Option<Constraint>> {
    if let Some(schema) = &a.json_schema {
        let text = match schema.trim_start().starts_with(['{', '[']) || schema.trim() == "true" {
            true => schema.clone(),
            false => std::fs::read_to_string(schema).map_err(|e| Error::io(schema, e))?,
        };
        let value = serde_json::from_str(&text)
            .map_err(|e| Error::InvalidArgument(format!("--json-schema: not JSON ({e})")))?;
        return Ok(Some(Constraint::JsonSchema(value)));
    }
    if let Some(rx) = &a.regex {
        return Ok(Some(Constraint::Regex(rx.clone())));
    }
    if let Some(path) = &a.grammar {
        let lark = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        return Ok(Some(Constraint::Lark(lark)));
    }
    Ok(None)
}

/// Generates for one prompt, streaming text (or printing one JSON object). The prompt's text is
/// echoed with the first generated piece, so a prompt the engine refuses (over the context,
/// say) prints nothing but the error.
fn run_one(engine: &Engine, text: Option<&str>, prompt: &[u32], options: &GenerateOptions, json: bool) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    let mut echo = text.filter(|_| !json);
    let g = engine.generate(prompt, options, |_, piece| {
        if !json {
            let _ = write!(stdout, "{}{piece}", echo.take().unwrap_or_default());
            let _ = stdout.flush();
        }
        true
    })?;
    if json {
        writeln!(stdout, "{}", serde_json::to_string(&g).expect("serialisable")).ok();
    } else {
        writeln!(stdout, "{}", echo.unwrap_or_default()).ok();
        stdout.flush().ok();
        let s = &g.stats;
        eprintln!(
            "[{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s, context {} ({} KV, {} bytes/token), peak RSS {:.0} MiB, GPU {:.0} MiB, {}]",
            g.prompt_tokens.len(),
            s.prefill_tokens_per_s,
            g.tokens.len(),
            s.decode_tokens_per_s,
            s.context,
            s.kv_dtype,
            s.kv_bytes_per_token,
            s.peak_rss_bytes as f64 / 1048576.0,
            s.gpu_bytes as f64 / 1048576.0,
            engine.gpu().adapter.name,
        );
        if options.drafts.is_some() || options.mtp_drafts > 0 {
            eprintln!(
                "[{} drafts: {} of {} accepted, {:.2} tokens per verify step over {} such steps]",
                if options.mtp_drafts > 0 { "MTP" } else { "prompt-lookup" },
                s.accepted_draft_tokens,
                s.draft_tokens,
                moestream::runtime::drafts::tokens_per_verify_step(s.accepted_draft_tokens, s.draft_steps),
                s.draft_steps
            );
        }
        let e = &s.experts;
        if e.expert_hits + e.expert_misses > 0 {
            eprintln!("[experts: {e}]");
        }
    }
    Ok(())
}
