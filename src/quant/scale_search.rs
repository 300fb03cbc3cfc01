//! Per-group choice of scale (and min) and of the 4-bit codes.
//!
//! Both searches evaluate every candidate exactly as the decoder will: scale and min are
//! rounded to f16 first, codes are re-derived from the rounded values, and the candidate with
//! the smallest sum of squared errors over the group wins.
//!
//! Candidates that do not depend on each other are measured side by side, in one pass over the
//! group ([`sym_sse`] takes a symmetric group's eight starting scales at once), and affine groups
//! are searched four at a time, one per vector lane ([`affine`], [`aff_fit`], which measures a
//! candidate and fits the next from its codes in the same pass): each candidate's sum is the same
//! operations in the same order as when measured alone, so the choice (and every stored byte)
//! is the same, but the CPU runs several dependency chains at once instead of waiting on one
//! chain of additions at a time (the quantizer is most of `convert`'s time).

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

/// [`sym_nibble`] as an f32, for the error sums.
#[inline]
fn sym_level(v: f32, inv: f32) -> f32 {
    floor_code((v * inv).clamp(-8.0, 7.0) + 8.5)
}

/// `c` rounded down, for `c` in [0.5, 15.5] (a code plus a half), as `c as u8` rounds it, in
/// operations that vectorize (a float-to-integer conversion does not, on x86-64's baseline):
/// adding and taking away 2^23 rounds to the nearest integer, one less where that rounded up.
/// `c` is never NaN: weights are finite (checked) and so are the scale's inverse and the min.
#[inline]
fn floor_code(c: f32) -> f32 {
    const SHIFT: f32 = 8_388_608.0;
    let r = (c + SHIFT) - SHIFT;
    if r > c {
        r - 1.0
    } else {
        r
    }
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

/// Affine groups searched at once, one per vector lane, by [`quantize`](super::quantize).
pub(crate) const AFFINE_LANES: usize = 4;

/// Codes, scale and min of each of `L` affine groups of one length (`xs`, codes into `codes`);
/// `Err(magnitude)` for a group where nothing fits in f16.
///
/// Starts from the min/max range and from ranges clipped by 5% / 10% at either or both ends;
/// each start is followed by two least-squares refits of `(scale, min)` given the codes
/// (minimizing `Σ (n·s + m − x)²`), re-deriving the codes after each. A start whose rounded
/// values are not finite, or whose refit is degenerate, ends its chain there; a constant group
/// has the one candidate `(0, value)`. The groups go through each step side by side (lane `k`
/// is group `k`, with exactly the operations it would have alone), and each group's candidates
/// are compared chain after chain, as if run one by one.
pub(crate) fn affine<const L: usize>(xs: [&[f32]; L], codes: [&mut [u8]; L]) -> [Result<(f16, f16), f32>; L] {
    let n = xs[0].len();
    debug_assert!(xs.iter().all(|x| x.len() == n), "groups of one length");
    let (mut lo, mut hi) = ([f32::INFINITY; L], [f32::NEG_INFINITY; L]);
    for (k, x) in xs.iter().enumerate() {
        for &v in *x {
            lo[k] = lo[k].min(v);
            hi[k] = hi[k].max(v);
        }
    }
    let range: [f32; L] = std::array::from_fn(|k| hi[k] - lo[k]);
    let mut current: [[Option<(f16, f16)>; L]; AFFINE_STARTS.len()] = std::array::from_fn(|c| {
        std::array::from_fn(|k| match range[k] == 0.0 {
            true => (c == 0).then(|| f16_pair(0.0, lo[k])).flatten(),
            false => {
                let (a, b) = AFFINE_STARTS[c];
                let (l, h) = (lo[k] + a * range[k], hi[k] - b * range[k]);
                f16_pair((h - l) / 15.0, l)
            }
        })
    });
    // Per round, chain and group: the candidate measured and its error.
    let mut tried = [[[None; L]; AFFINE_STARTS.len()]; AFFINE_REFITS + 1];
    // Each round measures every chain's candidates and fits the next ones (the last round's
    // fits go unused); a constant group is not refitted.
    let as_f32 = |c: Option<(f16, f16)>| c.map_or((0.0, 0.0), |(hs, hm)| (hs.to_f32(), hm.to_f32()));
    for round in tried.iter_mut() {
        for (chain, measured) in current.iter_mut().zip(round.iter_mut()) {
            if chain.iter().all(Option::is_none) {
                continue;
            }
            let (sse, refit) = aff_fit(&xs, chain.map(as_f32));
            for k in 0..L {
                measured[k] = chain[k].map(|pair| (sse[k], pair));
                chain[k] = chain[k].filter(|_| range[k] != 0.0).and(refit[k]).and_then(|(s, m)| f16_pair(s, m));
            }
        }
    }
    let mut codes = codes.into_iter();
    std::array::from_fn(|k| {
        let out = codes.next().expect("one code slice per group");
        let mut best = None;
        for c in 0..AFFINE_STARTS.len() {
            for (sse, pair) in tried.iter().filter_map(|round| round[c][k]) {
                keep(&mut best, sse, pair);
            }
        }
        let Some((_, (hs, hm))) = best else {
            return Err(lo[k].abs().max(hi[k].abs()));
        };
        let (inv, mf) = (recip(hs.to_f32()), hm.to_f32());
        for (c, &v) in out.iter_mut().zip(xs[k]) {
            *c = aff_code(v, inv, mf);
        }
        Ok((hs, hm))
    })
}

/// Code in 0..=15 nearest to `(v - m) * inv` (clamp, then round half up by truncation).
#[inline]
fn aff_code(v: f32, inv: f32, m: f32) -> u8 {
    aff_level(v, inv, m) as u8
}

/// [`aff_code`] as an f32, for the sums.
#[inline]
fn aff_level(v: f32, inv: f32, m: f32) -> f32 {
    floor_code(((v - m) * inv).clamp(0.0, 15.0) + 0.5)
}

/// For each group of `xs` (one length, at most 64) and its `(scale, min)` of `params`, in one
/// pass over the groups side by side: the squared error, and the least-squares `(scale, min)`
/// for the codes it assigns (`None` where degenerate).
///
/// The sums of the codes and of their squares are integers below 2^24 for a group (at most 64
/// codes of at most 15), so f32 holds them exactly, as f64 did.
fn aff_fit<const L: usize>(xs: &[&[f32]; L], params: [(f32, f32); L]) -> ([f32; L], [Option<(f32, f32)>; L]) {
    let n = xs[0].len();
    assert!(n <= 64, "a group has at most 64 weights");
    // The groups interleaved, so that one element of every group loads at once.
    let mut lanes = [[0.0f32; L]; 64];
    for (k, x) in xs.iter().enumerate() {
        for (lane, &v) in lanes.iter_mut().zip(*x) {
            lane[k] = v;
        }
    }
    let inv = params.map(|(s, _)| recip(s));
    let mut sse = [0.0f32; L];
    let (mut sx, mut sqx) = ([0.0f64; L], [0.0f64; L]);
    let (mut sq, mut sqq) = ([0.0f32; L], [0.0f32; L]);
    for vs in &lanes[..n] {
        for k in 0..L {
            let (v, (s, m)) = (vs[k], params[k]);
            let level = aff_level(v, inv[k], m);
            let e = level * s + m - v;
            sse[k] += e * e;
            sx[k] += v as f64;
            sq[k] += level;
            sqq[k] += level * level;
            sqx[k] += level as f64 * v as f64;
        }
    }
    let n = n as f64;
    let refit = std::array::from_fn(|k| {
        let (sq, sqq) = (sq[k] as f64, sqq[k] as f64);
        let det = n * sqq - sq * sq;
        if det <= 0.0 {
            return None;
        }
        let s2 = (n * sqx[k] - sq * sx[k]) / det;
        let m2 = (sx[k] - s2 * sq) / n;
        Some((s2 as f32, m2 as f32))
    });
    (sse, refit)
}
