//! [`GgmlType`]: the ggml tensor types moestream reads, with their block geometry.

/// A ggml tensor element type (the numbering of ggml's `enum ggml_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// 32 values: f16 scale `d`, 16 bytes of nibbles; `(q - 8) * d`.
    Q4_0,
    /// 32 values: f16 scale `d`, 32 signed bytes; `q * d`.
    Q8_0,
    /// 32 values: f16 scale `d`, 32 fifth bits (`qh`), 16 bytes of nibbles; `d * (q - 16)`
    /// (llama-quantize's fallback for Q4_K rows not a multiple of 256 wide).
    Q5_0,
    /// 32 values: f16 `d` and `m`, 32 fifth bits, 16 bytes of nibbles; `d * q + m` (the
    /// fallback for Q5_K).
    Q5_1,
    /// 256 values in 8 sub-blocks of 32: f16 `d`, `dmin`, 12 bytes of 6-bit scales and mins, nibbles.
    Q4K,
    /// As Q4_K plus a fifth bit per value (`qh`).
    Q5K,
    /// 256 values in 16 sub-blocks of 16: 6-bit codes (`ql` + `qh`), signed 8-bit scales, f16 `d`.
    Q6K,
    /// 32 values: an E8M0 exponent byte and 16 bytes of E2M1 nibbles (OCP microscaling).
    Mxfp4,
}

impl GgmlType {
    /// The type with ggml number `n`, or `None` when moestream does not read it.
    pub fn from_u32(n: u32) -> Option<GgmlType> {
        Some(match n {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::BF16,
            39 => GgmlType::Mxfp4,
            _ => return None,
        })
    }

    /// The type named `name` as [`GgmlType::name`] writes it, in any case (`q4_k`, `BF16`).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        [0, 1, 2, 6, 7, 8, 12, 13, 14, 30, 39]
            .into_iter()
            .filter_map(GgmlType::from_u32)
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// ggml's number for this type.
    pub fn to_u32(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::BF16 => 30,
            GgmlType::Mxfp4 => 39,
        }
    }

    /// ggml's name (`Q4_K`, `MXFP4`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4K => "Q4_K",
            GgmlType::Q5K => "Q5_K",
            GgmlType::Q6K => "Q6_K",
            GgmlType::Mxfp4 => "MXFP4",
        }
    }

    /// Values per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 | GgmlType::Mxfp4 => 32,
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,
            GgmlType::Q5_0 => 22,
            GgmlType::Q5_1 => 24,
            GgmlType::Q8_0 => 34,
            GgmlType::Q4K => 144,
            GgmlType::Q5K => 176,
            GgmlType::Q6K => 210,
            GgmlType::Mxfp4 => 17,
        }
    }

    /// Bytes of one row of `cols` values (`cols` a multiple of the block size).
    pub fn row_bytes(self, cols: usize) -> usize {
        cols / self.block_size() * self.type_size()
    }

    /// ggml's name for an unsupported type number, for error messages.
    pub fn describe(n: u32) -> String {
        const NAMES: [(u32, &str); 12] = [
            (3, "Q4_1"),
            (9, "Q8_1"),
            (10, "Q2_K"),
            (11, "Q3_K"),
            (15, "Q8_K"),
            (16, "IQ2_XXS"),
            (17, "IQ2_XS"),
            (18, "IQ3_XXS"),
            (19, "IQ1_S"),
            (20, "IQ4_NL"),
            (21, "IQ3_S"),
            (23, "IQ4_XS"),
        ];
        match NAMES.iter().find(|(k, _)| *k == n) {
            Some((_, name)) => (*name).to_string(),
            None => format!("#{n}"),
        }
    }
}
