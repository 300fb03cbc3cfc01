//! Several requests at once through the runtime's scheduler: each step carries a token of every
//! running request, each reply is the one it gets alone, and callbacks tell them apart.
//!
//! `cargo run --release --example parallel -- [MODEL_DIR]` (defaults to the bundled model).

use std::cell::RefCell;
use std::rc::Rc;

use moestream::runtime::logprobs::TokenLogprob;
use moestream::runtime::{GenerateOptions, SamplingParams, Scheduler};
use moestream::{Engine, EngineOptions};

fn main() -> moestream::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/models/moestream-tiny-moe").to_string());
    let mut options = EngineOptions::new(&dir);
    // The memory plan makes room for this many KV caches.
    options.parallel = 3;
    let engine = Engine::load(&options)?;
    let mut scheduler = Scheduler::new(&engine, 3)?;
    let prompts = ["The history of", "Once upon a time", "The jury said"];
    // What each request's callback has seen (the callbacks run on this thread, inside `step`).
    let streamed = Rc::new(RefCell::new(vec![String::new(); prompts.len()]));
    let mut ids = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let sampling = SamplingParams { temperature: 0.7, seed: i as u64, ..Default::default() };
        let options = GenerateOptions { max_tokens: 24, sampling, ..Default::default() };
        let seen = streamed.clone();
        // Each request's callback sees its tokens as they come (return false to end it).
        let on_token = Box::new(move |_id: u32, piece: &str, _logprob: Option<&TokenLogprob>| {
            seen.borrow_mut()[i].push_str(piece);
            true
        });
        ids.push(scheduler.submit(engine.encode(prompt)?, options, on_token)?);
    }
    // Steps run until every request has ended; `step()` runs one and returns those that ended.
    for finished in scheduler.run()? {
        let g = finished.result?;
        let i = ids.iter().position(|&id| id == finished.id).expect("one of ours");
        println!("[{}] {}{}  ({} tokens)", i, prompts[i], g.text, g.tokens.len());
        assert_eq!(streamed.borrow()[i], g.text, "the callback saw the whole text");
    }
    let (steps, sequences) = scheduler.step_counts();
    println!("{steps} steps carried {sequences} sequence-steps ({:.2} per step)", sequences as f64 / steps as f64);
    Ok(())
}
