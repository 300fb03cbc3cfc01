//! The RoPE parameter block: base, scaling kind, rotary width and pair layout, computed once on
//! the host into per-position cos/sin tables for the CPU reference and the GPU kernels alike.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fields::{get, obj_f32, obj_usize};
use crate::error::{Error, Result};

/// How the rotary frequencies are stretched for long contexts (`rope_type` of the config).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Plain RoPE (`default`).
    None,
    /// Position interpolation (`linear`): every frequency divided by `factor`.
    Linear {
        /// The stretch factor.
        factor: f32,
    },
    /// Dynamic NTK (`dynamic`). transformers only changes the base once a sequence grows past
    /// `max_position_embeddings`; the engine's context never does, so this is plain RoPE.
    Dynamic {
        /// The stretch factor (used only beyond `max_position_embeddings`).
        factor: f32,
    },
    /// Llama 3.1's banded interpolation (`llama3`).
    Llama3 {
        /// Stretch of the low frequencies.
        factor: f32,
        /// Wavelengths above `original / low_freq_factor` are fully stretched.
        low_freq_factor: f32,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f32,
        /// The pretraining context.
        original_max_positions: usize,
    },
    /// YaRN (`yarn`): ramped interpolation between `beta_fast` and `beta_slow` rotations and
    /// cos/sin multiplied by `attention_factor`.
    Yarn {
        /// Stretch factor.
        factor: f32,
        /// The pretraining context.
        original_max_positions: usize,
        /// Rotations where interpolation starts (default 32).
        beta_fast: f32,
        /// Rotations where it is complete (default 1).
        beta_slow: f32,
        /// The multiplier of cos and sin (from `attention_factor`, or from `factor`, `mscale`
        /// and `mscale_all_dim` as transformers infers it).
        attention_factor: f32,
        /// Round the correction range outward to whole dimensions (default true).
        truncate: bool,
    },
}

/// Everything that decides the rotary embedding of a query or key head.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeSpec {
    /// Base frequency.
    pub theta: f32,
    /// Long-context scaling.
    pub scaling: RopeScaling,
    /// The rotated dimensions at the start of each head (the rest pass through): `head_dim`,
    /// `head_dim * partial_rotary_factor` (GLM) or MLA's `qk_rope_head_dim`.
    pub rotary_dim: usize,
    /// Pairs are adjacent `(x[2i], x[2i+1])` (DeepSeek) instead of `(x[i], x[i + rotary_dim/2])`.
    pub interleaved: bool,
}

/// Keys of a RoPE parameter object that this module reads; any other key is refused by name.
const KNOWN_KEYS: &[&str] = &[
    "rope_type",
    "type",
    "rope_theta",
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
    "truncate",
    "low_freq_factor",
    "high_freq_factor",
    "partial_rotary_factor",
    // Qwen3.5's M-RoPE sections: a text-only sequence has the same position on every axis,
    // so its rotation is the 1-D RoPE above whatever the sections are.
    "mrope_section",
    "mrope_interleaved",
];

/// YaRN's magnitude correction `0.1 * mscale * ln(scale) + 1` (1 for `scale <= 1`).
pub fn yarn_mscale(scale: f32, mscale: f32) -> f32 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// The RoPE parameter object of a config: transformers-5 `rope_parameters` or the hub's
/// transformers-4 `rope_scaling` (whose base is the top-level `rope_theta`).
pub(super) fn rope_object(cfg: &Value) -> Option<&Value> {
    get(cfg, "rope_parameters").or_else(|| get(cfg, "rope_scaling"))
}

/// The `factor` of a RoPE object, `None` when absent.
pub(super) fn rope_factor(p: Option<&Value>) -> Result<Option<f32>> {
    p.map_or(Ok(None), |p| obj_f32(p, "factor", "rope factor"))
}

/// Parses the RoPE block. `head_dim` is the width `rotary_dim` is a fraction of; `default_theta`
/// and `default_partial` are the family's defaults; `interleaved` is the family's pair layout.
pub(super) fn parse(
    cfg: &Value,
    head_dim: usize,
    default_theta: f32,
    default_partial: f32,
    interleaved: bool,
    max_positions: usize,
) -> Result<RopeSpec> {
    let p = rope_object(cfg);
    if let Some(obj) = p.and_then(Value::as_object) {
        if let Some(k) = obj.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(Error::UnsupportedConfig(format!("RoPE parameter {k:?} is not implemented")));
        }
    }
    let kind = p
        .and_then(|p| p.get("rope_type").or_else(|| p.get("type")))
        .map(|v| v.as_str().ok_or_else(|| Error::ConfigField("rope_type".into())))
        .transpose()?
        .unwrap_or("default");
    let theta = match p.map(|p| obj_f32(p, "rope_theta", "rope_theta")).transpose()?.flatten() {
        Some(t) => t,
        None => super::fields::f32_field(cfg, "rope_theta", default_theta)?,
    };
    if theta.is_nan() || theta <= 1.0 {
        return Err(Error::UnsupportedConfig(format!("rope_theta {theta} must be above 1")));
    }
    let partial = match p.map(|p| obj_f32(p, "partial_rotary_factor", "partial_rotary_factor")).transpose()?.flatten() {
        Some(f) => f,
        None => super::fields::f32_field(cfg, "partial_rotary_factor", default_partial)?,
    };
    if partial.is_nan() || partial <= 0.0 || partial > 1.0 {
        return Err(Error::UnsupportedConfig(format!("partial_rotary_factor {partial} not in (0, 1]")));
    }
    let rotary_dim = (head_dim as f32 * partial) as usize;
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
        return Err(Error::UnsupportedConfig(format!("rotary dimension {rotary_dim} must be even and positive")));
    }
    let factor = rope_factor(p)?;
    let need_factor = || factor.filter(|f| *f >= 1.0).ok_or_else(|| Error::ConfigField("rope factor (>= 1)".into()));
    let original = || -> Result<usize> {
        p.map(|p| obj_usize(p, "original_max_position_embeddings"))
            .transpose()?
            .flatten()
            .ok_or_else(|| Error::ConfigField("original_max_position_embeddings".into()))
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: need_factor()? },
        "dynamic" => RopeScaling::Dynamic { factor: need_factor()? },
        "llama3" => {
            let p = p.expect("a rope type implies its object");
            let req = |k: &str| obj_f32(p, k, k)?.ok_or_else(|| Error::ConfigField(k.into()));
            let (low, high) = (req("low_freq_factor")?, req("high_freq_factor")?);
            if high.is_nan() || high <= low {
                return Err(Error::UnsupportedConfig(format!(
                    "llama3 high_freq_factor {high} <= low_freq_factor {low}"
                )));
            }
            RopeScaling::Llama3 {
                factor: need_factor()?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_positions: original()?,
            }
        }
        "yarn" => {
            let p = p.expect("a rope type implies its object");
            let original_max_positions = original()?;
            let factor = match factor {
                Some(f) => f,
                None => max_positions as f32 / original_max_positions as f32,
            };
            if factor.is_nan() || factor <= 0.0 {
                return Err(Error::ConfigField("rope factor (> 0)".into()));
            }
            let opt = |k: &str| obj_f32(p, k, k);
            let attention_factor = match opt("attention_factor")? {
                Some(a) => a,
                None => match (opt("mscale")?.filter(|m| *m != 0.0), opt("mscale_all_dim")?.filter(|m| *m != 0.0)) {
                    (Some(m), Some(m_all)) => yarn_mscale(factor, m) / yarn_mscale(factor, m_all),
                    _ => yarn_mscale(factor, 1.0),
                },
            };
            RopeScaling::Yarn {
                factor,
                original_max_positions,
                beta_fast: opt("beta_fast")?.filter(|b| *b != 0.0).unwrap_or(32.0),
                beta_slow: opt("beta_slow")?.filter(|b| *b != 0.0).unwrap_or(1.0),
                attention_factor,
                truncate: p.get("truncate").and_then(Value::as_bool).unwrap_or(true),
            }
        }
        other => return Err(Error::UnsupportedConfig(format!("rope scaling type {other:?} is not implemented"))),
    };
    Ok(RopeSpec { theta, scaling, rotary_dim, interleaved })
}

impl RopeSpec {
    /// Plain RoPE over `rotary_dim` dimensions in the rotate-half layout.
    pub fn plain(theta: f32, rotary_dim: usize) -> RopeSpec {
        RopeSpec { theta, scaling: RopeScaling::None, rotary_dim, interleaved: false }
    }

    /// The inverse frequency of every rotated pair (`rotary_dim / 2` values), in f32 as
    /// transformers computes them.
    pub fn inv_freq(&self) -> Vec<f32> {
        let dim = self.rotary_dim;
        let base: Vec<f32> = (0..dim / 2).map(|i| 1.0 / self.theta.powf((2 * i) as f32 / dim as f32)).collect();
        match self.scaling {
            RopeScaling::None | RopeScaling::Dynamic { .. } => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_positions } => {
                let old = original_max_positions as f32;
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn { factor, original_max_positions, beta_fast, beta_slow, truncate, .. } => {
                // Correction range in f64 as Python computes it, ramp and blend in f32 as torch does.
                let (d, b, orig) = (dim as f64, self.theta as f64, original_max_positions as f64);
                let corr = |rot: f64| (d * (orig / (rot * 2.0 * std::f64::consts::PI)).ln()) / (2.0 * b.ln());
                let (mut low, mut high) = (corr(beta_fast as f64), corr(beta_slow as f64));
                if truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                if low == high {
                    high += 0.001;
                }
                let (low, span) = (low as f32, (high - low) as f32);
                (0..dim / 2)
                    .map(|i| {
                        let pos_freq = self.theta.powf((2 * i) as f32 / dim as f32);
                        let (extra, inter) = (1.0 / pos_freq, 1.0 / (factor * pos_freq));
                        let ramp = ((i as f32 - low) / span).clamp(0.0, 1.0);
                        let extra_factor = 1.0 - ramp;
                        inter * (1.0 - extra_factor) + extra * extra_factor
                    })
                    .collect()
            }
        }
    }

    /// The multiplier of cos and sin (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f32 {
        match self.scaling {
            RopeScaling::Yarn { attention_factor, .. } => attention_factor,
            _ => 1.0,
        }
    }

    /// cos and sin of every (position, pair) for `positions` positions, `[positions,
    /// rotary_dim / 2]` each: `angle = pos * inv_freq` in f32, times [`attention_factor`](Self::attention_factor).
    pub fn tables(&self, positions: usize) -> (Vec<f32>, Vec<f32>) {
        let inv = self.inv_freq();
        let scale = self.attention_factor();
        let mut cos = Vec::with_capacity(positions * inv.len());
        let mut sin = Vec::with_capacity(positions * inv.len());
        for p in 0..positions {
            for f in &inv {
                let angle = (p as f32 * f) as f64;
                cos.push(angle.cos() as f32 * scale);
                sin.push(angle.sin() as f32 * scale);
            }
        }
        (cos, sin)
    }

    /// The pair `(a, b)` that pair `i` of a head rotates: adjacent or half a rotary width apart.
    pub fn pair(&self, i: usize) -> (usize, usize) {
        if self.interleaved {
            (2 * i, 2 * i + 1)
        } else {
            (i, i + self.rotary_dim / 2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(cfg: Value) -> Result<RopeSpec> {
        parse(&cfg, 64, 10000.0, 1.0, false, 4096)
    }

    #[test]
    fn both_layouts_parse_the_same_yarn() {
        let t4 = json!({"rope_theta": 10000.0, "rope_scaling": {"type": "yarn", "factor": 40.0,
            "original_max_position_embeddings": 4096, "mscale": 0.707, "mscale_all_dim": 0.707}});
        let t5 = json!({"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
            "original_max_position_embeddings": 4096, "mscale": 0.707, "mscale_all_dim": 0.707}});
        let (a, b) = (spec(t4).unwrap(), spec(t5).unwrap());
        assert_eq!(a, b);
        // mscale == mscale_all_dim: cos/sin are not rescaled.
        assert!((a.attention_factor() - 1.0).abs() < 1e-7);
        // The highest frequency is extrapolated, the lowest interpolated by the factor.
        let (plain, yarn) = (RopeSpec::plain(10000.0, 64).inv_freq(), a.inv_freq());
        assert_eq!(yarn[0], plain[0]);
        assert!((yarn[31] - plain[31] / 40.0).abs() < 1e-12);
    }

    #[test]
    fn unknown_kinds_and_keys_are_refused_by_name() {
        let e = spec(json!({"rope_scaling": {"type": "longrope", "factor": 2.0}})).unwrap_err();
        assert!(e.to_string().contains("longrope"), "{e}");
        let e = spec(json!({"rope_scaling": {"type": "linear", "factor": 2.0, "short_factor": [1.0]}})).unwrap_err();
        assert!(e.to_string().contains("short_factor"), "{e}");
    }

    #[test]
    fn linear_divides_and_partial_rotary_narrows() {
        let s = spec(json!({"partial_rotary_factor": 0.5, "rope_scaling": {"type": "linear", "factor": 4.0}})).unwrap();
        assert_eq!(s.rotary_dim, 32);
        let plain = RopeSpec::plain(10000.0, 32).inv_freq();
        for (a, b) in s.inv_freq().iter().zip(&plain) {
            assert_eq!(*a, b / 4.0);
        }
    }
}
