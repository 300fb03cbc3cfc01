//! Benchmark inputs: seeded random token ids and requests cut from a model's `validation.txt`.

use crate::error::Result;
use crate::util::rng::SplitMix64;
use crate::Engine;

/// `n` token ids drawn uniformly from `0..vocab` by a stream seeded with `seed`.
pub fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| (rng.next_u64() % vocab as u64) as u32).collect()
}

/// Prompts for a multi-request benchmark, and where they came from.
#[derive(Clone, Debug)]
pub struct Requests {
    /// One prompt (token ids) per request.
    pub prompts: Vec<Vec<u32>>,
    /// `"validation.txt"` or `"random ids (seed S)"`.
    pub source: String,
}

/// `count` prompts of `tokens` ids each: consecutive windows of the model directory's
/// `validation.txt` when it has one and a tokenizer (wrapping around a short text), else
/// seeded random ids (request `i` uses seed `seed + i`).
pub fn requests(engine: &Engine, count: usize, tokens: usize, seed: u64) -> Result<Requests> {
    let path = engine.model_dir().join("validation.txt");
    if engine.tokenizer().is_some() && path.exists() {
        let text = std::fs::read_to_string(&path).map_err(|e| crate::Error::io(&path, e))?;
        let ids = engine.encode(&text)?;
        if !ids.is_empty() {
            let prompts =
                (0..count).map(|r| (0..tokens).map(|i| ids[(r * tokens + i) % ids.len()]).collect()).collect();
            return Ok(Requests { prompts, source: "validation.txt".into() });
        }
    }
    let vocab = engine.spec().vocab;
    let prompts = (0..count).map(|r| random_tokens(tokens, vocab, seed.wrapping_add(r as u64))).collect();
    Ok(Requests { prompts, source: format!("random ids (seed {seed})") })
}

#[cfg(test)]
mod tests {
    use super::random_tokens;

    #[test]
    fn random_tokens_are_seeded_and_in_range() {
        let a = random_tokens(100, 37, 5);
        assert_eq!(a, random_tokens(100, 37, 5));
        assert_ne!(a, random_tokens(100, 37, 6));
        assert!(a.iter().all(|&t| t < 37));
    }
}
