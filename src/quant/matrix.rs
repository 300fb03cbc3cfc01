//! [`Int4Matrix`]: quantization of a row-major f32 matrix and CPU dequantization.

use half::f16;

use super::{pack, scale_search, Int4Layout, Int4Scheme, QuantError, QuantParams};

/// An int4 group-quantized `[rows, cols]` matrix (see the [module docs](super) for the format).
#[derive(Debug, Clone, PartialEq)]
pub struct Int4Matrix {
    /// Rows (output dimension of a linear layer).
    pub rows: usize,
    /// Columns (input dimension, the quantized one).
    pub cols: usize,
    /// Scheme and group size.
    pub params: QuantParams,
    /// Packed codes: `rows * cols / 8` words, row-major, 8 nibbles per word, low nibble first.
    pub packed: Vec<u32>,
    /// One f16 scale per (row, group), row-major `[rows, ceil(cols / group_size)]`.
    pub scales: Vec<f16>,
    /// One f16 min per (row, group) for affine; empty for symmetric.
    pub mins: Vec<f16>,
}

/// Matrices with at least this many weights are quantized on several threads.
const PARALLEL_THRESHOLD: usize = 1 << 18;

/// Quantizes a row-major `[rows, cols]` f32 matrix group-wise along `cols`.
///
/// Scale choice (per group, minimizing the group's squared error with the f16-rounded scale):
/// * symmetric: the better of `absmax / 7` and the signed `-e / 8` ("-8 trick", `e` the element
///   of largest magnitude, so it lands on the extra negative code), a few clipped variants,
///   and a least-squares refit;
/// * affine: `(max − min) / 15` with `min` as offset, clipped variants, each refined by two
///   least-squares refits of `(scale, min)`.
///
/// Errors (never panics): bad group size, `cols` not a multiple of it, empty matrix, wrong
/// slice length, a non-finite weight, or a scale/min beyond the f16 range.
pub fn quantize(weights: &[f32], rows: usize, cols: usize, params: QuantParams) -> Result<Int4Matrix, QuantError> {
    params.check_shape(rows, cols)?;
    if weights.len() != rows * cols {
        return Err(QuantError::LengthMismatch { rows, cols, len: weights.len() });
    }
    if let Some(i) = weights.iter().position(|v| !v.is_finite()) {
        return Err(QuantError::NonFinite { row: i / cols, col: i % cols, value: weights[i] });
    }
    let gpr = params.groups_per_row(cols);
    let wpr = cols / 8;
    let mut m = Int4Matrix {
        rows,
        cols,
        params,
        packed: vec![0; rows * wpr],
        scales: vec![f16::ZERO; rows * gpr],
        mins: if params.scheme.has_mins() { vec![f16::ZERO; rows * gpr] } else { Vec::new() },
    };
    let threads = if rows * cols >= PARALLEL_THRESHOLD {
        std::thread::available_parallelism().map_or(1, |n| n.get()).min(rows)
    } else {
        1
    };
    let rows_per = rows.div_ceil(threads);
    let has_mins = params.scheme.has_mins();
    let mut jobs = Vec::with_capacity(threads);
    let mut mins_rest: &mut [f16] = &mut m.mins;
    for (i, ((w, p), s)) in weights
        .chunks(rows_per * cols)
        .zip(m.packed.chunks_mut(rows_per * wpr))
        .zip(m.scales.chunks_mut(rows_per * gpr))
        .enumerate()
    {
        let mins: &mut [f16] = if has_mins {
            let (head, tail) = std::mem::take(&mut mins_rest).split_at_mut(s.len());
            mins_rest = tail;
            head
        } else {
            &mut []
        };
        jobs.push((i * rows_per, w, p, s, mins));
    }
    if jobs.len() == 1 {
        let (r0, w, p, s, mn) = jobs.pop().expect("one job");
        quantize_rows(r0, w, cols, params, p, s, mn)?;
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|(r0, w, p, s, mn)| scope.spawn(move || quantize_rows(r0, w, cols, params, p, s, mn)))
                .collect();
            handles.into_iter().try_for_each(|h| h.join().expect("quantization thread panicked"))
        })?;
    }
    Ok(m)
}

/// Quantizes consecutive rows starting at `row0` into the given output slices.
fn quantize_rows(
    row0: usize,
    weights: &[f32],
    cols: usize,
    params: QuantParams,
    packed: &mut [u32],
    scales: &mut [f16],
    mins: &mut [f16],
) -> Result<(), QuantError> {
    let gpr = params.groups_per_row(cols);
    let mut codes = vec![0u8; cols];
    for (r, (row, words)) in weights.chunks_exact(cols).zip(packed.chunks_exact_mut(cols / 8)).enumerate() {
        let overflow = |gi: usize| {
            let col = params.group_cols(gi, cols).start;
            move |value| QuantError::F16Overflow { row: row0 + r, col, value }
        };
        let mut gi = 0;
        while gi < gpr {
            let span = params.group_cols(gi, cols);
            match params.scheme {
                Int4Scheme::Symmetric => {
                    let out = &mut codes[span.clone()];
                    scales[r * gpr + gi] = scale_search::symmetric(&row[span], out).map_err(overflow(gi))?;
                    gi += 1;
                }
                Int4Scheme::Affine => {
                    // Full groups four at a time, one per lane; the rest (a row's last groups,
                    // a shorter last group) one by one.
                    let lanes = scale_search::AFFINE_LANES;
                    let whole = gi + lanes <= gpr && params.group_cols(gi + lanes - 1, cols).len() == span.len();
                    let mut keep = |found: Result<(f16, f16), f32>| {
                        let (s, m) = found.map_err(overflow(gi))?;
                        scales[r * gpr + gi] = s;
                        mins[r * gpr + gi] = m;
                        gi += 1;
                        Ok::<(), QuantError>(())
                    };
                    if whole {
                        let all = span.start..span.start + lanes * span.len();
                        let mut xs = row[all.clone()].chunks_exact(span.len());
                        let mut outs = codes[all].chunks_exact_mut(span.len());
                        let found = scale_search::affine::<{ scale_search::AFFINE_LANES }>(
                            std::array::from_fn(|_| xs.next().expect("a group per lane")),
                            std::array::from_fn(|_| outs.next().expect("a group per lane")),
                        );
                        found.into_iter().try_for_each(&mut keep)?;
                    } else {
                        let [found] = scale_search::affine([&row[span.clone()]], [&mut codes[span]]);
                        keep(found)?;
                    }
                }
            }
        }
        pack::pack_row(&codes, words);
    }
    Ok(())
}

impl Int4Matrix {
    /// The serialized layout of this matrix.
    pub fn layout(&self) -> Int4Layout {
        Int4Layout::new(self.rows, self.cols, self.params).expect("an Int4Matrix always has a valid shape")
    }

    /// The 4-bit code (`0..=15`) of element `(r, c)`.
    pub fn code(&self, r: usize, c: usize) -> u8 {
        let wpr = self.cols / 8;
        pack::unpack_nibble(&self.packed[r * wpr..(r + 1) * wpr], c)
    }

    /// Dequantizes row `r` into `out[..cols]`.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() < cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} out of range for {} rows", self.rows);
        assert!(out.len() >= self.cols, "output row has {} < {} elements", out.len(), self.cols);
        let gpr = self.params.groups_per_row(self.cols);
        let wpr = self.cols / 8;
        let words = &self.packed[r * wpr..(r + 1) * wpr];
        for gi in 0..gpr {
            let s = self.scales[r * gpr + gi].to_f32();
            let span = self.params.group_cols(gi, self.cols);
            let start = span.start;
            let group = &mut out[span];
            match self.params.scheme {
                Int4Scheme::Symmetric => {
                    for (j, o) in group.iter_mut().enumerate() {
                        let n = pack::unpack_nibble(words, start + j);
                        *o = (n as f32 - 8.0) * s;
                    }
                }
                Int4Scheme::Affine => {
                    let m = self.mins[r * gpr + gi].to_f32();
                    for (j, o) in group.iter_mut().enumerate() {
                        let n = pack::unpack_nibble(words, start + j);
                        *o = n as f32 * s + m;
                    }
                }
            }
        }
    }

    /// Dequantizes the whole matrix to row-major f32.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }
}

impl Int4Matrix {
    /// Rows `range` as their own matrix (groups are per row, so this is exactly what
    /// quantizing those rows alone gives).
    pub fn rows(&self, range: std::ops::Range<usize>) -> Int4Matrix {
        let wpr = self.cols / 8;
        let gpr = self.params.groups_per_row(self.cols);
        let slice_groups =
            |v: &Vec<f16>| if v.is_empty() { Vec::new() } else { v[range.start * gpr..range.end * gpr].to_vec() };
        Int4Matrix {
            rows: range.len(),
            cols: self.cols,
            params: self.params,
            packed: self.packed[range.start * wpr..range.end * wpr].to_vec(),
            scales: slice_groups(&self.scales),
            mins: slice_groups(&self.mins),
        }
    }
}
