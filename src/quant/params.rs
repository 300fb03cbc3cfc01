//! Quantization parameters: scheme and group size.

use super::QuantError;

/// How a group's 4-bit codes map back to values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Int4Scheme {
    /// `value = (n - 8) * scale`: one f16 scale per group, codes -8..=7.
    Symmetric,
    /// `value = n * scale + min`: f16 scale and min per group, codes 0..=15.
    ///
    /// The default: it measured lower error than symmetric at equal group size on both Gaussian
    /// and heavy-tailed weights (see `tests/quant_error.rs`).
    #[default]
    Affine,
}

impl Int4Scheme {
    /// Short lowercase name (`"symmetric"` / `"affine"`).
    pub fn name(self) -> &'static str {
        match self {
            Int4Scheme::Symmetric => "symmetric",
            Int4Scheme::Affine => "affine",
        }
    }

    /// Whether the scheme stores a per-group min (offset) segment.
    pub fn has_mins(self) -> bool {
        matches!(self, Int4Scheme::Affine)
    }
}

/// The supported group sizes.
pub const GROUP_SIZES: [usize; 2] = [32, 64];

/// Parameters of an int4 quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QuantParams {
    /// Symmetric or affine.
    pub scheme: Int4Scheme,
    /// Columns per group: 32 or 64.
    pub group_size: usize,
}

impl Default for QuantParams {
    /// Affine, groups of 32.
    fn default() -> Self {
        QuantParams { scheme: Int4Scheme::Affine, group_size: 32 }
    }
}

impl QuantParams {
    /// Builds parameters, rejecting unsupported group sizes.
    pub fn new(scheme: Int4Scheme, group_size: usize) -> Result<Self, QuantError> {
        let p = QuantParams { scheme, group_size };
        p.validate()?;
        Ok(p)
    }

    /// Checks that the group size is supported.
    pub fn validate(&self) -> Result<(), QuantError> {
        if GROUP_SIZES.contains(&self.group_size) {
            Ok(())
        } else {
            Err(QuantError::BadGroupSize(self.group_size))
        }
    }

    /// Checks the parameters and that a `[rows, cols]` matrix can use them.
    pub fn check_shape(&self, rows: usize, cols: usize) -> Result<(), QuantError> {
        self.validate()?;
        if rows == 0 || cols == 0 {
            return Err(QuantError::Empty { rows, cols });
        }
        if !cols.is_multiple_of(8) {
            return Err(QuantError::ColsNotMultiple { rows, cols });
        }
        Ok(())
    }

    /// Groups per row: `ceil(cols / group_size)`; the last group is shorter when `cols` is not
    /// a multiple of the group size (it is always a multiple of 8, one packed word).
    pub fn groups_per_row(&self, cols: usize) -> usize {
        cols.div_ceil(self.group_size)
    }

    /// Columns of group `gi` in a row of `cols`.
    pub fn group_cols(&self, gi: usize, cols: usize) -> std::ops::Range<usize> {
        gi * self.group_size..((gi + 1) * self.group_size).min(cols)
    }
}
