//! The one seeded random stream every part uses (sampling, prerouter training, benchmark
//! workloads): SplitMix64, small, fast and the same on every platform.

/// A reproducible SplitMix64 stream.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A stream starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed ^ 0x9E37_79B9_7F4A_7C15 }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform value in `[-1, 1)`.
    pub fn next_signed(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// The Gumbel noise of token `id` under `key`, `-ln(-ln(u))` for a `u` in (0, 1) hashed from
/// both: the same key gives every token independent noise. Sampling picks the candidate with the
/// largest scaled logit plus its noise (the Gumbel-max trick: each with its probability), and
/// the MTP module's sampled drafts the token with the largest logit plus the noise of the key
/// its verify row will draw with (`shaders/argmax.wgsl`'s `NOISE` variant computes the same in
/// 32-bit integers), so a draft is accepted whenever module and model agree under that noise.
pub fn token_noise(key: u64, id: u32) -> f32 {
    let k = mix32(key as u32 ^ mix32((key >> 32) as u32));
    let h = mix32(mix32(k ^ id) ^ (key >> 32) as u32);
    let u = ((h >> 8) as f32 + 0.5) / 16_777_216.0;
    -(-u.ln()).ln()
}

/// A 32-bit integer hash with full avalanche (lowbias32).
fn mix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846c_a68b);
    h ^ (h >> 16)
}

#[cfg(test)]
mod tests {
    use super::{token_noise, SplitMix64};

    #[test]
    fn token_noise_is_standard_gumbel() {
        // Mean 0.5772 (Euler's constant), variance pi^2 / 6, over ids and keys alike.
        let (mut n, mut sum, mut sq) = (0.0f64, 0.0f64, 0.0f64);
        for key in [1u64, 0xdead_beef_0000_0001, u64::MAX] {
            for id in 0..20_000u32 {
                let g = token_noise(key, id) as f64;
                (n, sum, sq) = (n + 1.0, sum + g, sq + g * g);
            }
        }
        let mean = sum / n;
        let var = sq / n - mean * mean;
        assert!((mean - 0.5772).abs() < 0.02, "mean {mean}");
        assert!((var - 1.6449).abs() < 0.05, "variance {var}");
        assert_ne!(token_noise(1, 5), token_noise(2, 5), "another key, other noise");
        assert_eq!(token_noise(9, 5), token_noise(9, 5));
    }

    #[test]
    fn the_stream_is_fixed_by_its_seed() {
        let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
        let xs: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..4).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(xs[0], SplitMix64::new(8).next_u64());
        let f = SplitMix64::new(1).next_signed();
        assert!((-1.0..1.0).contains(&f));
    }
}
