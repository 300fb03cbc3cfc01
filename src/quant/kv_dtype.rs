//! [`KvDtype`]: the element type of the KV cache, and how a row of each is laid out.

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// Half precision (two per u32, packed and unpacked in f32 arithmetic): the default, half
    /// the memory and half the bytes read per decode step.
    #[default]
    F16,
    /// Single precision: bit-comparable with the f32 reference.
    F32,
    /// llama.cpp's q8_0 in spirit: blocks of 32 values along a row as int8 codes with one f16
    /// scale each (`x ≈ code * scale`, `scale = max |x| / 127`), about 0.53× f16's bytes. See
    /// [`Q8Rows`] for rows that are not a multiple of 64.
    Q8_0,
    /// llama.cpp's q4_0 in spirit: q8_0's blocks with 4-bit codes, `x ≈ code * scale` for a code
    /// in -7..=7 (stored plus 8, eight to a word) and `scale = max |x| / 7`, about 0.28× f16's
    /// bytes.
    Q4_0,
}

/// How a q8_0 or q4_0 cache holds rows of one width: each row's codes (one byte, or four bits,
/// per value), then (after every row's codes) each row's scales, f16, two to a word. Blocks are 32 values where the
/// width is a multiple of 64, else half a row where the width is a multiple of 16, else a
/// whole row; a row's scales then fill whole words (an even count, or one block and a pad).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8Rows {
    /// Values per block (a multiple of 8).
    pub block: usize,
    /// Blocks per row.
    pub blocks: usize,
}

impl Q8Rows {
    /// The layout of rows of `width` values (a multiple of 8).
    pub fn of(width: usize) -> Q8Rows {
        let block = match width {
            w if w.is_multiple_of(64) => 32,
            w if w.is_multiple_of(16) => w / 2,
            w => w,
        };
        Q8Rows { block, blocks: width / block.max(1) }
    }

    /// Scale words per row (two f16 scales to a word).
    pub fn scale_words(&self) -> usize {
        self.blocks.div_ceil(2)
    }

    /// Scales one u32 word holds for this layout: 2, or 1 for rows of one block (whose word's
    /// other half is padding).
    pub fn scales_per_word(&self) -> usize {
        if self.blocks == 1 {
            1
        } else {
            2
        }
    }

    /// Bytes of one row of `code_bits`-bit codes (8: q8_0, 4: q4_0) and its scale words.
    pub fn row_bytes(&self, code_bits: usize) -> usize {
        self.block * self.blocks * code_bits / 8 + 4 * self.scale_words()
    }
}

impl KvDtype {
    /// Bytes of one cached row of `width` values (a multiple of 8).
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            KvDtype::F16 => 2 * width,
            KvDtype::F32 => 4 * width,
            KvDtype::Q8_0 => Q8Rows::of(width).row_bytes(8),
            KvDtype::Q4_0 => Q8Rows::of(width).row_bytes(4),
        }
    }

    /// Whether the cache holds codes with block scales ([`Q8Rows`]).
    pub fn is_quantized(self) -> bool {
        matches!(self, KvDtype::Q8_0 | KvDtype::Q4_0)
    }

    /// `"f16"`, `"f32"`, `"q8_0"` or `"q4_0"`.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        }
    }

    /// A row of `x` as a cache of this type holds it (the CPU reference's round trip): f32 as
    /// it is, f16 rounded value by value; q8_0 and q4_0 each block's codes `round(x / scale)`
    /// (halves away from zero, at most 127 or 7 in magnitude) times its f16 scale, as the cache
    /// store computes them.
    pub fn round_trip(self, x: &[f32]) -> Vec<f32> {
        let top = match self {
            KvDtype::F32 => return x.to_vec(),
            KvDtype::F16 => return x.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect(),
            KvDtype::Q8_0 => 127.0,
            KvDtype::Q4_0 => 7.0,
        };
        x.chunks(Q8Rows::of(x.len()).block)
            .flat_map(|b| {
                let (scale, codes) = quantize_block(b, top);
                codes.into_iter().map(move |c| c * scale)
            })
            .collect()
    }
}

/// One block's f16 scale (as f32) and codes: `d = max |x| / top`, codes `round(x * (1 / d))`
/// (halves away from zero), at most `top` in magnitude.
fn quantize_block(x: &[f32], top: f32) -> (f32, Vec<f32>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / top;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let code = |v: &f32| {
        let s = v * inv;
        (s.abs() + 0.5).floor().min(top).copysign(s)
    };
    (half::f16::from_f32(d).to_f32(), x.iter().map(code).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_rows_halve_f16() {
        assert_eq!(Q8Rows::of(128), Q8Rows { block: 32, blocks: 4 });
        assert_eq!(KvDtype::Q8_0.row_bytes(128), 136);
        assert_eq!(KvDtype::Q4_0.row_bytes(128), 72);
        assert_eq!(KvDtype::Q4_0.row_bytes(8), 8);
        assert_eq!(KvDtype::Q8_0.row_bytes(64), 68);
        assert_eq!(Q8Rows::of(16), Q8Rows { block: 8, blocks: 2 });
        assert_eq!(Q8Rows::of(8), Q8Rows { block: 8, blocks: 1 });
        assert_eq!(KvDtype::Q8_0.row_bytes(8), 12);
        assert_eq!(Q8Rows::of(96), Q8Rows { block: 48, blocks: 2 });
        assert_eq!(Q8Rows::of(72), Q8Rows { block: 72, blocks: 1 });
    }

    #[test]
    fn round_trip_is_within_half_a_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.173).collect();
        let y = KvDtype::Q8_0.round_trip(&x);
        for (b, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let step = xs.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            for (a, r) in xs.iter().zip(ys) {
                // Half a step, and the f16 rounding of the scale over up to 127 steps.
                assert!((a - r).abs() <= step * 0.6, "block {b}: {a} -> {r}");
            }
        }
        assert_eq!(KvDtype::Q8_0.round_trip(&[0.0; 8]), vec![0.0; 8]);
        let y = KvDtype::Q4_0.round_trip(&x);
        for (xs, ys) in x.chunks(32).zip(y.chunks(32)) {
            let step = xs.iter().fold(0f32, |m, v| m.max(v.abs())) / 7.0;
            for (a, r) in xs.iter().zip(ys) {
                assert!((a - r).abs() <= step * 0.51, "q4_0: {a} -> {r}");
            }
        }
    }
}
