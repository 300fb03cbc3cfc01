//! Host time of drawing one sampled token (`Sampler::sample`) at real vocabulary sizes (Mixtral's
//! 32000, Qwen's 151936, gpt-oss's 201088), for temperature alone, top-p, top-k and both, over
//! seeded flat logits (a nucleus of much of the vocabulary) and peaked ones (a few likely tokens,
//! as language models mostly give). Every sampled decode token pays this on the CPU after its
//! logits come back.
//!
//! `cargo run --release --example sampler_speed`

use moestream::runtime::sampler::{Sampler, SamplingParams};

fn main() {
    let draws = 50;
    println!("| vocab | logits | top_k | top_p | ms per token |");
    println!("|---:|---|---:|---:|---:|");
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
            for (top_k, top_p) in [(0, 1.0), (0, 0.9), (40, 1.0), (40, 0.95)] {
                let mut s =
                    Sampler::new(SamplingParams { temperature: 0.7, top_k, top_p, seed: 1, ..Default::default() });
                let started = std::time::Instant::now();
                let ids: u64 = (0..draws).map(|_| s.sample(&mut logits, &[]) as u64).sum();
                let ms = started.elapsed().as_secs_f64() * 1e3 / draws as f64;
                let kind = if peaked { "peaked" } else { "flat" };
                println!("| {vocab} | {kind} | {top_k} | {top_p} | {ms:.3} |");
                std::hint::black_box(ids);
            }
        }
    }
}
