//! Per-group choice of scale (and min) and of the 4-bit codes.
//!
//! Both searches evaluate every candidate exactly as the decoder will: scale and min are
//! rounded to f16 first, codes are re-derived from the rounded values, and the candidate with
//! the smallest sum of squared errors over the group wins.
//!
//! Candidates that do not depend on each other are measured side by side, in one pass over the
//! group ([`sym_sse`] and [`aff_fit`] take several at once, and the latter measures a candidate
//! and fits the next from its codes in the same pass): each candidate's sum is
//! the same operations in the same order as when measured alone, so the choice (and every
//! stored byte) is the same, but the CPU overlaps the candidates' dependency chains instead of
//! waiting on one chain of additions at a time (the quantizer is most of `convert`'s time).

use half::f16;

/// Codes and scale of one symmetric group; `Err(absmax)` if no candidate scale fits in f16.
///
/// Candidates: let `e` be the element of largest magnitude. The classic `e / 7` (maps `e` to
/// code ±7) and the signed "-8 trick" `-e / 8` (a possibly negative scale that maps `e` to the
/// otherwise unused code -8, giving 16 usable levels on `e`'s side), plus a few slightly smaller
/// scales that clip the extreme (`-e/8.5 .. -e/10`, `e/7.5`, `e/8`). Then one least-squares
/// refit `s = Σ q·x / Σ q²` of the best candidate's codes. All scales may be negative.
pub(crate) fn symmetric(x: &[f32], codes: &mut [u8]) -> Result<f16, f32> {
    let (mut ext, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            ext = v;
        }
    }
    if amax == 0.0 {
        codes.fill(8);
        return Ok(f16::ZERO);
    }
    let mut best: Option<(f32, f16)> = None;
    let starts = [-ext / 8.0, -ext / 8.5, -ext / 9.0, -ext / 9.5, -ext / 10.0, ext / 7.0, ext / 7.5, ext / 8.0]
        .map(|s| Some(f16::from_f32(s)).filter(|h| h.to_f32().is_finite()));
    let sse = sym_sse(x, starts.map(|h| h.map_or(0.0, f16::to_f32)));
    for (h, sse) in starts.into_iter().zip(sse) {
        if let Some(h) = h {
            keep(&mut best, sse, h);
        }
    }
    let Some((_, h)) = best else {
        return Err(amax);
    };
    // Least-squares refit of the scale for the chosen codes.
    let inv = recip(h.to_f32());
    let (mut qx, mut qq) = (0.0f64, 0.0f64);
    for &v in x {
        let q = sym_nibble(v, inv) as f64 - 8.0;
        qx += q * v as f64;
        qq += q * q;
    }
    if qq > 0.0 {
        let h = f16::from_f32((qx / qq) as f32);
        if h.to_f32().is_finite() {
            keep(&mut best, sym_sse(x, [h.to_f32()])[0], h);
        }
    }
    let (_, h) = best.expect("a finite candidate exists");
    let inv = recip(h.to_f32());
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = sym_nibble(v, inv);
    }
    Ok(h)
}

/// Makes `(sse, value)` the best so far if there is none yet or `sse` is smaller (the first of
/// equal candidates stays).
fn keep<T>(best: &mut Option<(f32, T)>, sse: f32, value: T) {
    if best.as_ref().is_none_or(|(b, _)| sse < *b) {
        *best = Some((sse, value));
    }
}

/// `1 / s`, or 0 when `s` is 0 (every code then decodes to 0 or to the min).
#[inline]
fn recip(s: f32) -> f32 {
    if s == 0.0 {
        0.0
    } else {
        1.0 / s
    }
}

/// Offset-binary nibble `q + 8` of the signed code `q` in -8..=7 nearest to `v * inv`
/// (clamp, then round half up via truncation of a non-negative value: no libm call).
#[inline]
fn sym_nibble(v: f32, inv: f32) -> u8 {
    sym_level(v, inv) as u8
}

/// [`sym_nibble`] as an f32, for the error sums (`as i32` truncates as `as u8` does in this
/// range, NaN to 0 too).
#[inline]
fn sym_level(v: f32, inv: f32) -> f32 {
    ((v * inv).clamp(-8.0, 7.0) + 8.5) as i32 as f32
}

/// The squared error of the group under each of the symmetric `scales`, in one pass.
fn sym_sse<const N: usize>(x: &[f32], scales: [f32; N]) -> [f32; N] {
    let inv = scales.map(recip);
    let mut sse = [0.0f32; N];
    for &v in x {
        for k in 0..N {
            let e = (sym_level(v, inv[k]) - 8.0) * scales[k] - v;
            sse[k] += e * e;
        }
    }
    sse
}

/// The ranges the affine search starts from: the fractions of `max − min` clipped at the low and
/// at the high end.
const AFFINE_STARTS: [(f32, f32); 5] = [(0.0, 0.0), (0.05, 0.0), (0.0, 0.05), (0.05, 0.05), (0.1, 0.1)];

/// Least-squares refits after each affine start.
const AFFINE_REFITS: usize = 2;

/// `(scale, min)` rounded to f16, if both stay finite.
fn f16_pair(s: f32, m: f32) -> Option<(f16, f16)> {
    let (hs, hm) = (f16::from_f32(s), f16::from_f32(m));
    (hs.to_f32().is_finite() && hm.to_f32().is_finite()).then_some((hs, hm))
}

/// Codes, scale and min of one affine group; `Err(magnitude)` if nothing fits in f16.
///
/// Starts from the min/max range and from ranges clipped by 5% / 10% at either or both ends;
/// each start is followed by two least-squares refits of `(scale, min)` given the codes
/// (minimizing `Σ (n·s + m − x)²`), re-deriving the codes after each. A start whose rounded
/// values are not finite, or whose refit is degenerate, ends its chain there. The chains run
/// side by side, and their candidates are compared chain after chain, as if run one by one.
pub(crate) fn affine(x: &[f32], codes: &mut [u8]) -> Result<(f16, f16), f32> {
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in x {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let range = hi - lo;
    let mut best: Option<(f32, (f16, f16))> = None;
    let as_f32 = |c: Option<(f16, f16)>| c.map_or((0.0, 0.0), |(hs, hm)| (hs.to_f32(), hm.to_f32()));
    if range == 0.0 {
        if let Some((hs, hm)) = f16_pair(0.0, lo) {
            keep(&mut best, aff_fit(x, [as_f32(Some((hs, hm)))]).0[0], (hs, hm));
        }
    } else {
        let mut current = AFFINE_STARTS.map(|(a, b)| {
            let (l, h) = (lo + a * range, hi - b * range);
            f16_pair((h - l) / 15.0, l)
        });
        let mut tried = [[None; AFFINE_REFITS + 1]; AFFINE_STARTS.len()];
        // Each round measures the candidates and fits the next ones (the last round's fits
        // go unused).
        for t in 0..=AFFINE_REFITS {
            let (sse, refit) = aff_fit_all(x, current.map(as_f32));
            for ((chain, c), sse) in tried.iter_mut().zip(current).zip(sse) {
                chain[t] = c.map(|pair| (sse, pair));
            }
            for (c, r) in current.iter_mut().zip(refit) {
                *c = c.and(r).and_then(|(s, m)| f16_pair(s, m));
            }
        }
        for (sse, pair) in tried.into_iter().flatten().flatten() {
            keep(&mut best, sse, pair);
        }
    }
    let Some((_, (hs, hm))) = best else {
        return Err(lo.abs().max(hi.abs()));
    };
    let (inv, mf) = (recip(hs.to_f32()), hm.to_f32());
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = aff_code(v, inv, mf);
    }
    Ok((hs, hm))
}

/// Code in 0..=15 nearest to `(v - m) * inv` (clamp, then round half up by truncation).
#[inline]
fn aff_code(v: f32, inv: f32, m: f32) -> u8 {
    aff_level(v, inv, m) as u8
}

/// [`aff_code`] as an f32 (see [`sym_level`]).
#[inline]
fn aff_level(v: f32, inv: f32, m: f32) -> f32 {
    (((v - m) * inv).clamp(0.0, 15.0) + 0.5) as i32 as f32
}

/// [`aff_fit`] of the five chains' candidates: four side by side (as many as fit the vector
/// registers of every x86-64; five spill accumulators to the stack), then the fifth.
fn aff_fit_all(x: &[f32], p: [(f32, f32); 5]) -> ([f32; 5], [Option<(f32, f32)>; 5]) {
    let (four, four_fits) = aff_fit(x, [p[0], p[1], p[2], p[3]]);
    let ([fifth], [fifth_fit]) = aff_fit(x, [p[4]]);
    let sse = [four[0], four[1], four[2], four[3], fifth];
    let fits = [four_fits[0], four_fits[1], four_fits[2], four_fits[3], fifth_fit];
    (sse, fits)
}

/// For each affine `(scale, min)` of `params`, in one pass: the group's squared error, and the
/// least-squares `(scale, min)` for the codes it assigns (`None` where degenerate).
///
/// The sums of the codes and of their squares are integers below 2^24 for a group (at most 64
/// codes of at most 15), so f32 holds them exactly, as f64 did.
fn aff_fit<const N: usize>(x: &[f32], params: [(f32, f32); N]) -> ([f32; N], [Option<(f32, f32)>; N]) {
    debug_assert!(x.len() <= 1 << 16, "code sums stay exact in f32 for groups up to 2^16");
    let n = x.len() as f64;
    let inv = params.map(|(s, _)| recip(s));
    let mut sse = [0.0f32; N];
    let mut sx = 0.0f64;
    let (mut sq, mut sqq, mut sqx) = ([0.0f32; N], [0.0f32; N], [0.0f64; N]);
    for &v in x {
        sx += v as f64;
        for k in 0..N {
            let (s, m) = params[k];
            let level = aff_level(v, inv[k], m);
            let e = level * s + m - v;
            sse[k] += e * e;
            sq[k] += level;
            sqq[k] += level * level;
            sqx[k] += level as f64 * v as f64;
        }
    }
    let (sq, sqq) = (sq.map(f64::from), sqq.map(f64::from));
    let refit = std::array::from_fn(|k| {
        let det = n * sqq[k] - sq[k] * sq[k];
        if det <= 0.0 {
            return None;
        }
        let s2 = (n * sqx[k] - sq[k] * sx) / det;
        let m2 = (sx - s2 * sq[k]) / n;
        Some((s2 as f32, m2 as f32))
    });
    (sse, refit)
}
