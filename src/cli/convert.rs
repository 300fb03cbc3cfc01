//! `moestream convert`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};

use moestream::convert::{convert, ConvertOptions, ConvertSummary, Phase, Progress};
use moestream::quant::{Int4Scheme, QuantParams};
use moestream::Result;

/// Bits per weight.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Bits {
    /// Int4 group quantization.
    #[value(name = "4")]
    Four,
    /// f16.
    #[value(name = "16")]
    Sixteen,
}

impl Bits {
    fn get(self) -> u32 {
        match self {
            Bits::Four => 4,
            Bits::Sixteen => 16,
        }
    }
}

/// Int4 group size.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum GroupSize {
    /// 32 columns per scale.
    #[value(name = "32")]
    G32,
    /// 64 columns per scale.
    #[value(name = "64")]
    G64,
}

/// Int4 scheme.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Scheme {
    /// Per-group scale and min.
    Affine,
    /// Per-group scale, codes -8..=7.
    Symmetric,
}

/// Flags of `convert`.
#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json).
    src: PathBuf,
    /// Output directory (created; must be new, empty, or an earlier conversion).
    out: PathBuf,
    /// Bits per routed-expert weight.
    #[arg(long, value_enum, default_value = "4")]
    bits: Bits,
    /// Int4 group size.
    #[arg(long, value_enum, default_value = "32")]
    group_size: GroupSize,
    /// Bits per attention / dense MLP / lm_head weight (embeddings and routers stay f16).
    #[arg(long, value_enum, default_value = "4")]
    attention_bits: Bits,
    /// Int4 scheme.
    #[arg(long, value_enum, default_value = "affine")]
    scheme: Scheme,
    /// Threads encoding routed experts (default: one per core; the output is the same).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Experts => "experts",
        Phase::Resident => "resident",
        Phase::Finishing => "finishing",
    }
}

/// Runs `convert`.
pub fn run(a: ConvertArgs) -> Result<()> {
    let scheme = match a.scheme {
        Scheme::Affine => Int4Scheme::Affine,
        Scheme::Symmetric => Int4Scheme::Symmetric,
    };
    let group_size = match a.group_size {
        GroupSize::G32 => 32,
        GroupSize::G64 => 64,
    };
    let params = QuantParams { scheme, group_size };
    let options = ConvertOptions {
        threads: a.threads,
        ..ConvertOptions::from_bits(a.bits.get(), a.attention_bits.get(), params)?
    };
    // Drawn on stderr, and only when it is a terminal.
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "{msg:>9} [{bar:40}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let mut progress = |p: Progress| {
        bar.set_length(p.total_bytes);
        bar.set_position(p.done_bytes);
        bar.set_message(phase_name(p.phase));
    };
    let result = convert(&a.src, &a.out, &options, &mut progress);
    bar.finish_and_clear();
    let summary = result?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&summary).expect("serialisable"));
    } else {
        print_summary(&summary);
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn print_summary(s: &ConvertSummary) {
    println!("converted into    {}", s.out_dir.display());
    println!("source            {}", mib(s.source_bytes));
    println!(
        "resident          {} ({} tensors, dense {})",
        mib(s.resident_bytes),
        s.resident_tensors,
        s.dense_encoding
    );
    println!("experts           {} ({} experts, {})", mib(s.experts_bytes), s.experts, s.experts_encoding);
    println!("output            {}", mib(s.output_bytes));
    println!("time              {:.2} s ({}/s)", s.seconds, mib(s.throughput_bytes_per_s as u64));
    println!("peak RSS          {}", mib(s.peak_rss_bytes));
}
