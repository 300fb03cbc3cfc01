//! Per-group choice of scale (and min) and of the 4-bit codes.
//!
//! Both searches evaluate every candidate exactly as the decoder will: scale and min are
//! rounded to f16 first, codes are re-derived from the rounded values, and the candidate with
//! the smallest sum of squared errors over the group wins.

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
    let consider = |s: f32, best: &mut Option<(f32, f16)>| {
        let h = f16::from_f32(s);
        let sf = h.to_f32();
        if !sf.is_finite() {
            return;
        }
        let sse = sym_sse(x, sf);
        if best.is_none_or(|(b, _)| sse < b) {
            *best = Some((sse, h));
        }
    };
    for d in [8.0f32, 8.5, 9.0, 9.5, 10.0] {
        consider(-ext / d, &mut best);
    }
    for d in [7.0f32, 7.5, 8.0] {
        consider(ext / d, &mut best);
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
        consider((qx / qq) as f32, &mut best);
    }
    let (_, h) = best.expect("a finite candidate exists");
    let inv = recip(h.to_f32());
    for (c, &v) in codes.iter_mut().zip(x) {
        *c = sym_nibble(v, inv);
    }
    Ok(h)
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
    ((v * inv).clamp(-8.0, 7.0) + 8.5) as u8
}

fn sym_sse(x: &[f32], s: f32) -> f32 {
    let inv = recip(s);
    x.iter()
        .map(|&v| {
            let e = (sym_nibble(v, inv) as f32 - 8.0) * s - v;
            e * e
        })
        .sum()
}

/// Codes, scale and min of one affine group; `Err(magnitude)` if nothing fits in f16.
///
/// Starts from the min/max range and from ranges clipped by 5% / 10% at either or both ends;
/// each start is followed by two least-squares refits of `(scale, min)` given the codes
/// (minimizing `Σ (n·s + m − x)²`), re-deriving the codes after each.
pub(crate) fn affine(x: &[f32], codes: &mut [u8]) -> Result<(f16, f16), f32> {
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in x {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    let range = hi - lo;
    let mut best: Option<(f32, f16, f16)> = None;
    let consider = |s: f32, m: f32, best: &mut Option<(f32, f16, f16)>| -> Option<(f32, f32)> {
        let (hs, hm) = (f16::from_f32(s), f16::from_f32(m));
        let (sf, mf) = (hs.to_f32(), hm.to_f32());
        if !sf.is_finite() || !mf.is_finite() {
            return None;
        }
        let sse = aff_sse(x, sf, mf);
        if best.is_none_or(|(b, _, _)| sse < b) {
            *best = Some((sse, hs, hm));
        }
        Some((sf, mf))
    };
    if range == 0.0 {
        consider(0.0, lo, &mut best);
    } else {
        for (a, b) in [(0.0f32, 0.0f32), (0.05, 0.0), (0.0, 0.05), (0.05, 0.05), (0.1, 0.1)] {
            let (l, h) = (lo + a * range, hi - b * range);
            let Some(mut cur) = consider((h - l) / 15.0, l, &mut best) else {
                continue;
            };
            for _ in 0..2 {
                let Some((s, m)) = aff_refit(x, cur.0, cur.1) else {
                    break;
                };
                match consider(s, m, &mut best) {
                    Some(next) => cur = next,
                    None => break,
                }
            }
        }
    }
    let Some((_, hs, hm)) = best else {
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
    (((v - m) * inv).clamp(0.0, 15.0) + 0.5) as u8
}

fn aff_sse(x: &[f32], s: f32, m: f32) -> f32 {
    let inv = recip(s);
    x.iter()
        .map(|&v| {
            let e = aff_code(v, inv, m) as f32 * s + m - v;
            e * e
        })
        .sum()
}

/// Least-squares `(scale, min)` for the codes that `(s, m)` assigns; `None` if degenerate.
fn aff_refit(x: &[f32], s: f32, m: f32) -> Option<(f32, f32)> {
    let n = x.len() as f64;
    let inv = recip(s);
    let (mut sq, mut sqq, mut sx, mut sqx) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for &v in x {
        let q = aff_code(v, inv, m) as f64;
        sq += q;
        sqq += q * q;
        sx += v as f64;
        sqx += q * v as f64;
    }
    let det = n * sqq - sq * sq;
    if det <= 0.0 {
        return None;
    }
    let s2 = (n * sqx - sq * sx) / det;
    let m2 = (sx - s2 * sq) / n;
    Some((s2 as f32, m2 as f32))
}
