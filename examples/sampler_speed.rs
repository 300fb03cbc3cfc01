//! Host time of drawing one sampled token (`Sampler::sample`) at real vocabulary sizes (Mixtral's
//! 32000, Qwen's 151936, gpt-oss's 201088), for temperature alone, top-p, top-k, both, and the
//! default chain (llama.cpp's: top-k 40, top-p, min-p, a repetition penalty over 64 tokens), over
//! seeded flat logits (a nucleus of much of the vocabulary) and peaked ones (a few likely tokens,
//! as language models mostly give). Every sampled decode token pays this on the CPU after its
//! logits come back.
//!
//! `cargo run --release --example sampler_speed`

use moestream::runtime::sampler::{Sampler, SamplingParams};

fn main() {
    let draws = 50;
    println!("| vocab | logits | set | top_k | top_p | min_p | repeat penalty | ms per token |");
    println!("|---:|---|---|---:|---:|---:|---:|---:|");
    for vocab in [32000usize, 151936, 201088] {
        for peaked in [false, true] {
            let mut x = 12345u64;
            let mut logits: Vec<f32> = (0..vocab)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let u = (x >> 40) as f32 / 16777216.0;
                    if peaked {
                        30.0 * u.powi(16)
                    } else {
                        20.0 * u - 10.0
                    }
                })
                .collect();
            let flags = |top_k, top_p| SamplingParams { temperature: 0.7, top_k, top_p, seed: 1, ..Default::default() };
            let cases = [
                ("-", flags(0, 1.0)),
                ("-", flags(0, 0.9)),
                ("-", flags(40, 1.0)),
                ("-", flags(40, 0.95)),
                ("llama.cpp's defaults", SamplingParams::llama_cpp()),
            ];
            // The penalties look back over a history of the last 64 tokens.
            let history: Vec<u32> = (0..64u32).map(|i| i * 7919 % vocab as u32).collect();
            for (name, params) in cases {
                let mut s = Sampler::new(params);
                let started = std::time::Instant::now();
                let ids: u64 = (0..draws).map(|_| s.sample(&mut logits, &history) as u64).sum();
                let ms = started.elapsed().as_secs_f64() * 1e3 / draws as f64;
                let kind = if peaked { "peaked" } else { "flat" };
                let (top_k, top_p, min_p, repeat) = (params.top_k, params.top_p, params.min_p, params.penalties.repeat);
                println!("| {vocab} | {kind} | {name} | {top_k} | {top_p} | {min_p} | {repeat} | {ms:.3} |");
                std::hint::black_box(ids);
            }
        }
    }
}
