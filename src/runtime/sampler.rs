//! Choosing the next token from logits: penalties, greedy, temperature, top-k, top-p, min-p,
//! seeded.

use super::penalties::Penalties;
use crate::util::rng::{token_noise, SplitMix64};

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
    /// Drop tokens whose probability is below this fraction of the most likely one's (0 = off;
    /// applied after top-p, on the logits before the temperature, as llama.cpp).
    pub min_p: f32,
    /// Penalties on tokens the sequence already holds (none by default).
    pub penalties: Penalties,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0, min_p: 0.0, penalties: Penalties::default() }
    }
}

impl SamplingParams {
    /// Refuses values that would sample silently wrong: a temperature that is negative or not
    /// finite, a top-p outside (0, 1].
    pub fn validate(&self) -> crate::Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(crate::Error::InvalidArgument(format!(
                "temperature {} is not a number >= 0 (0 is greedy)",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(crate::Error::InvalidArgument(format!("top-p {} is not in (0, 1]", self.top_p)));
        }
        if !(0.0..1.0).contains(&self.min_p) {
            return Err(crate::Error::InvalidArgument(format!("min-p {} is not in [0, 1)", self.min_p)));
        }
        self.penalties.validate()
    }

    /// Whether this picks the argmax of the logits.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Whether the GPU can choose the token itself (greedy, no penalties), so only 4 bytes come
    /// back instead of the logits.
    pub fn argmax_on_gpu(&self) -> bool {
        self.is_greedy() && !self.penalties.active()
    }
}

/// A seeded sampler (SplitMix64 stream: small, fast, reproducible across platforms). Each draw
/// takes the next key of the stream and picks the candidate with the largest scaled logit plus
/// its Gumbel noise under that key ([`token_noise`]): a draw with its probability, and one whose
/// noise is known before the logits are ([`Sampler::upcoming_keys`]), so the MTP module's
/// drafts can be picked under the same noise.
pub struct Sampler {
    params: SamplingParams,
    rng: SplitMix64,
    /// The penalties' window, kept between tokens.
    window: Vec<u32>,
}

impl Sampler {
    /// A sampler for `params`.
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler { params, rng: SplitMix64::new(params.seed), window: Vec::new() }
    }

    /// Applies the penalties to `logits` (`history` the sequence so far); then greedy, the
    /// argmax (`Ok`), else the candidates sampling draws from (`Err`).
    fn penalised(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32, Vec<Candidate>> {
        if self.params.penalties.active() {
            self.params.penalties.apply(logits, history, &mut self.window);
        }
        match self.params.is_greedy() {
            true => Ok(argmax(logits)),
            false => Err(self.params.candidates(logits)),
        }
    }

    /// Picks a token from `logits`, `history` the sequence so far (what penalties look at).
    /// The penalties are applied to `logits` in place.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        let candidates = match self.penalised(logits, history) {
            Ok(greedy) => return greedy,
            Err(candidates) => candidates,
        };
        let key = self.rng.next_u64();
        // The largest noisy logit (each candidate's noise computed once); ties to the lower id.
        let noisy = candidates.iter().map(|c| (c.scaled + token_noise(key, c.id), c.id));
        let best = noisy.reduce(|a, b| match b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)) {
            std::cmp::Ordering::Greater => b,
            _ => a,
        });
        best.expect("a vocabulary has tokens").1
    }

    /// The keys of the next `n` draws, in order (none are taken): the noise the verify rows of a
    /// step with `n - 1` drafts will draw with. Empty when this sampler is greedy.
    pub fn upcoming_keys(&self, n: usize) -> Vec<u64> {
        if self.params.is_greedy() {
            return Vec::new();
        }
        let mut rng = self.rng.clone();
        (0..n).map(|_| rng.next_u64()).collect()
    }

    /// What this sampler draws with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }
}

/// A token sampling may draw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Token id.
    pub id: u32,
    /// Its logit over the temperature.
    pub scaled: f32,
    /// Its unnormalised probability, `exp(scaled - max)`.
    pub weight: f64,
}

impl SamplingParams {
    /// The tokens sampling draws from: the `top_k` with the highest logits (all with 0; ties rank
    /// the lower id first), then the smallest highest-first prefix of those holding `top_p` of
    /// their probability. Only what top-k and top-p need is put in order (a selection, then a
    /// sort of a prefix that grows until it holds the nucleus) and only the candidates' weights
    /// are computed, so a 150K-token vocabulary is neither sorted nor, with top-k, exponentiated
    /// whole for every token.
    pub fn candidates(&self, logits: &[f32]) -> Vec<Candidate> {
        let t = self.temperature;
        let scaled = logits.iter().enumerate().map(|(i, &l)| (i as u32, l / t));
        let mut cands = match self.top_k {
            k if k > 0 && k < logits.len() => {
                let mut all: Vec<(u32, f32)> = scaled.collect();
                best_first(&mut all, k, |c| c.1, |c| c.0);
                all.truncate(k);
                let max = all[0].1;
                weighted(all.into_iter(), max)
            }
            // Dividing by t > 0 keeps the order, so the largest logit gives the largest quotient.
            _ => weighted(scaled, logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l)) / t),
        };
        if self.top_p < 1.0 {
            let wanted = self.top_p as f64 * cands.iter().map(|c| c.weight).sum::<f64>();
            let mut m = cands.len().min(64);
            loop {
                best_first(&mut cands, m, |c| c.scaled, |c| c.id);
                let mut acc = 0.0;
                if let Some(last) = cands[..m].iter().position(|c| {
                    acc += c.weight;
                    acc >= wanted
                }) {
                    cands.truncate(last + 1);
                    break;
                }
                if m == cands.len() {
                    break;
                }
                m = (m * 4).min(cands.len());
            }
        }
        if self.min_p > 0.0 {
            // The threshold on the logits before the temperature, as a scaled logit.
            let max = cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.scaled));
            let floor = max + self.min_p.ln() / t;
            cands.retain(|c| c.scaled >= floor);
        }
        cands
    }
}

/// `ranked` (token, scaled logit) as candidates, weighed against the largest scaled logit `max`.
fn weighted(ranked: impl Iterator<Item = (u32, f32)>, max: f32) -> Vec<Candidate> {
    ranked.map(|(id, scaled)| Candidate { id, scaled, weight: ((scaled - max) as f64).exp() }).collect()
}

/// Puts the `m` items of `items` with the highest `key` first, highest first (ties: lower `id`
/// first).
fn best_first<T>(items: &mut [T], m: usize, key: impl Fn(&T) -> f32, id: impl Fn(&T) -> u32) {
    let order = |a: &T, b: &T| key(b).total_cmp(&key(a)).then(id(a).cmp(&id(b)));
    if m < items.len() {
        items.select_nth_unstable_by(m - 1, order);
    }
    items[..m].sort_by(order);
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
    #[test]
    fn min_p_drops_tokens_below_its_share_of_the_best() {
        // exp(-1) = 0.37 of the best's probability: below 0.5, above 0.3.
        let logits = [0.0, -10.0, 1.0];
        let p = SamplingParams { temperature: 1.0, min_p: 0.5, ..Default::default() };
        let ids: Vec<u32> = p.candidates(&logits).iter().map(|c| c.id).collect();
        assert_eq!(ids, [2]);
        // The threshold is on the logits before the temperature, as llama.cpp's.
        let p = SamplingParams { temperature: 4.0, min_p: 0.3, ..Default::default() };
        let mut ids: Vec<u32> = p.candidates(&logits).iter().map(|c| c.id).collect();
        ids.sort();
        assert_eq!(ids, [0, 2]);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let ok = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, seed: 1, ..Default::default() };
        assert!(ok.validate().is_ok());
        for (bad, word) in [
            (SamplingParams { temperature: -1.0, ..ok }, "temperature"),
            (SamplingParams { temperature: f32::NAN, ..ok }, "temperature"),
            (SamplingParams { temperature: f32::INFINITY, ..ok }, "temperature"),
            (SamplingParams { top_p: 2.0, ..ok }, "top-p"),
            (SamplingParams { top_p: 0.0, ..ok }, "top-p"),
            (SamplingParams { top_p: f32::NAN, ..ok }, "top-p"),
            (SamplingParams { min_p: 1.0, ..ok }, "min-p"),
            (SamplingParams { min_p: -0.1, ..ok }, "min-p"),
            (SamplingParams { penalties: Penalties { repeat: f32::NAN, ..ok.penalties }, ..ok }, "repeat penalty"),
        ] {
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(word), "{bad:?}: {e}");
        }
    }

    use super::*;

    #[test]
    fn greedy_takes_first_max() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&mut [0.0, 3.0, 3.0, 1.0], &[]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_and_seeds_reproduce() {
        let mut logits = [0.1, 0.5, 2.0, 1.9, -1.0];
        let p = SamplingParams { temperature: 1.0, top_k: 1, ..Default::default() };
        assert_eq!(Sampler::new(p).sample(&mut logits, &[]), 2);
        let p = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 7, ..Default::default() };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..50).map(|_| s.sample(&mut logits, &[])).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p);
            (0..50).map(|_| s.sample(&mut logits, &[])).collect()
        };
        assert_eq!(a, b);
        assert!(a.contains(&3), "sampling explores beyond the argmax");
    }

    /// The candidates as the whole vocabulary sorted highest logit first, then cut.
    fn candidates_by_full_sort(p: &SamplingParams, logits: &[f32]) -> Vec<(u32, f64)> {
        let mut all: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l / p.temperature)).collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            all.truncate(p.top_k);
        }
        let max = all[0].1;
        let mut all: Vec<(u32, f64)> = all.into_iter().map(|(i, l)| (i, ((l - max) as f64).exp())).collect();
        if p.top_p < 1.0 {
            let total: f64 = all.iter().map(|c| c.1).sum();
            let mut acc = 0.0;
            let keep = all.iter().position(|c| {
                acc += c.1;
                acc >= p.top_p as f64 * total
            });
            all.truncate(keep.map_or(all.len(), |i| i + 1));
        }
        all
    }

    #[test]
    fn candidates_are_those_of_a_full_sort() {
        // Flat and peaked logits over a few vocabulary sizes, with ties (values on a coarse
        // grid), so the nucleus is sometimes a handful of tokens and sometimes most of them.
        let mut x = 99u64;
        let mut unit = || {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 40) as f32 / 16777216.0
        };
        let mut checked = 0;
        for vocab in [1, 7, 64, 65, 300, 5000] {
            for peak in [1, 16] {
                let logits: Vec<f32> = (0..vocab).map(|_| ((unit().powi(peak) * 40.0).round() - 20.0) / 2.0).collect();
                for top_k in [0, 1, 2, 40, 64, 5000, 9999] {
                    for top_p in [1.0, 0.999, 0.9, 0.5, 0.01] {
                        for temperature in [0.3, 1.0, 1.7] {
                            let p = SamplingParams { temperature, top_k, top_p, ..Default::default() };
                            // The same tokens and weights (in whatever order the draw walks them).
                            let mut got = p.candidates(&logits);
                            got.sort_by(|a, b| b.scaled.total_cmp(&a.scaled).then(a.id.cmp(&b.id)));
                            let got: Vec<(u32, f64)> = got.iter().map(|c| (c.id, c.weight)).collect();
                            let want = candidates_by_full_sort(&p, &logits);
                            assert_eq!(
                                got, want,
                                "vocab {vocab} peak {peak} top_k {top_k} top_p {top_p} t {temperature}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 6 * 2 * 7 * 5 * 3);
    }

    #[test]
    fn draws_follow_the_candidates_weights() {
        let mut logits = [2.0, 1.0, 0.5, 0.0, -1.0, 3.0];
        let p = SamplingParams { temperature: 1.0, top_k: 4, top_p: 1.0, seed: 11, ..Default::default() };
        let cands: Vec<(u32, f64)> = p.candidates(&logits).iter().map(|c| (c.id, c.weight)).collect();
        let total: f64 = cands.iter().map(|c| c.1).sum();
        let mut s = Sampler::new(p);
        let mut counts = [0usize; 6];
        let draws = 20000;
        for _ in 0..draws {
            counts[s.sample(&mut logits, &[]) as usize] += 1;
        }
        assert_eq!((counts[3], counts[4]), (0, 0), "outside the top 4");
        for (id, w) in cands {
            let (got, want) = (counts[id as usize] as f64 / draws as f64, w / total);
            assert!((got - want).abs() < 0.015, "token {id}: drawn {got:.4}, probability {want:.4}");
        }
    }

    #[test]
    fn a_draw_is_the_noisy_argmax_under_its_key() {
        // Without top-k and top-p a draw is the argmax over the whole vocabulary of the scaled
        // logits plus the noise of the key `upcoming_keys` announced: what a sampled MTP draft
        // computes on the GPU.
        let mut logits: Vec<f32> = (0..500).map(|i| ((i * 37 % 101) as f32 - 50.0) / 10.0).collect();
        let p = SamplingParams { temperature: 0.8, seed: 5, ..Default::default() };
        let mut s = Sampler::new(p);
        let keys = s.upcoming_keys(40);
        for key in keys {
            let noisy: Vec<f32> =
                logits.iter().enumerate().map(|(i, &l)| l / 0.8 + token_noise(key, i as u32)).collect();
            assert_eq!(s.sample(&mut logits, &[]), argmax(&noisy));
        }
        assert!(Sampler::new(SamplingParams::default()).upcoming_keys(3).is_empty(), "greedy draws no noise");
    }

    #[test]
    fn top_p_restricts_to_nucleus() {
        // Two dominant tokens hold ~99.9% of the mass; top_p 0.9 must never pick the others.
        let mut logits = [10.0, 10.0, 0.0, 0.0, 0.0];
        let p = SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.9, seed: 3, ..Default::default() };
        let mut s = Sampler::new(p);
        for _ in 0..200 {
            assert!(s.sample(&mut logits, &[]) < 2);
        }
    }
}
