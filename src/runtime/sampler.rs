//! Choosing the next token from logits: greedy, temperature, top-k, top-p, seeded.

/// How to pick tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1.0 = all).
    pub top_p: f32,
    /// Random seed.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    /// Whether this picks the argmax (so the GPU can choose and only 4 bytes come back).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }
}

/// A seeded sampler (SplitMix64 stream: small, fast, reproducible across platforms).
pub struct Sampler {
    params: SamplingParams,
    state: u64,
}

impl Sampler {
    /// A sampler for `params`.
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler { params, state: params.seed ^ 0x9E37_79B9_7F4A_7C15 }
    }

    fn next_f64(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Picks a token from `logits`.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let t = self.params.temperature;
        let mut cands: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l / t)).collect();
        cands.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if self.params.top_k > 0 {
            cands.truncate(self.params.top_k);
        }
        let max = cands[0].1;
        let mut probs: Vec<f64> = cands.iter().map(|c| ((c.1 - max) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if self.params.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs
                .iter()
                .position(|p| {
                    acc += p;
                    acc >= self.params.top_p as f64
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= total);
        }
        let mut r = self.next_f64();
        for (i, p) in probs.iter().enumerate() {
            if r < *p {
                return cands[i].0;
            }
            r -= p;
        }
        cands[probs.len() - 1].0
    }
}

/// Index of the largest value (the first among equals).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_max() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&[0.0, 3.0, 3.0, 1.0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_reproduce() {
        let logits = [0.1, 0.5, 2.0, 1.9, -1.0];
        let p = SamplingParams { temperature: 1.0, top_k: 1, ..Default::default() };
        assert_eq!(Sampler::new(p).sample(&logits), 2);
        let p = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 7 };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..50).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        assert!(a.contains(&3), "sampling explores beyond the argmax");
    }

    #[test]
    fn top_p_restricts_to_nucleus() {
        // Two dominant tokens hold ~99.9% of the mass; top_p 0.9 must never pick the others.
        let logits = [10.0, 10.0, 0.0, 0.0, 0.0];
        let p = SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.9, seed: 3 };
        let mut s = Sampler::new(p);
        for _ in 0..200 {
            assert!(s.sample(&logits) < 2);
        }
    }
}
