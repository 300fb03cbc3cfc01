//! Embedding moestream in an application: load a model, stream a generation through a
//! callback (stopping it early), and score a sentence.
//!
//! `cargo run --release --example embed -- [MODEL_DIR]` (defaults to the bundled model).

use moestream::runtime::{GenerateOptions, SamplingParams};
use moestream::{Engine, EngineOptions};

fn main() -> moestream::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/models/moestream-tiny-moe").to_string());
    let engine = Engine::load(&EngineOptions::new(&dir))?;
    println!("loaded {} on {}", engine.spec().family.hf_name(), engine.gpu().adapter.name);

    let prompt = engine.encode("The history of")?;
    let options = GenerateOptions {
        max_tokens: 40,
        sampling: SamplingParams { temperature: 0.8, top_p: 0.95, seed: 1, ..Default::default() },
        ..Default::default()
    };
    let mut pieces = 0;
    let generation = engine.generate(&prompt, &options, |_id, piece| {
        print!("{piece}");
        pieces += 1;
        pieces < 30 // returning false cancels the generation
    })?;
    println!("\n{} tokens at {:.1} tok/s", generation.tokens.len(), generation.stats.decode_tokens_per_s);

    let score = engine.score(&engine.encode("The cat sat on the mat.")?)?;
    println!("perplexity of a test sentence: {:.2}", score.perplexity);
    Ok(())
}
