//! MLX quantized safetensors (`quantization` in `config.json`: `bits`, `group_size`; each
//! quantized linear `X` stored as `X.weight` u32 words of 8 low-nibble-first codes, `X.scales`,
//! `X.biases`, value `q * scale + bias`). That is moestream's affine int4 exactly (value
//! `n * scale + min`, the same packing), so 4-bit MLX tensors are read losslessly into
//! [`Int4Matrix`] with `min = bias`, as long as every scale and bias is an f16 value (MLX stores
//! them in the model's dtype; bf16 ones must convert exactly) and the group size is one
//! moestream has (32, 64). 8-bit tensors and group 128 are refused by name.

use std::path::Path;

use half::f16;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::quant::{Int4Matrix, Int4Scheme, QuantParams};

/// The int4 parameters of an MLX-quantized directory (`None` when `config.json` has no
/// `quantization`), or a typed refusal of what moestream cannot read losslessly.
pub fn params(dir: &Path) -> Result<Option<QuantParams>> {
    let path = dir.join("config.json");
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
    let cfg: Value = serde_json::from_str(&text).map_err(|e| Error::Json { path, message: e.to_string() })?;
    let Some(q) = cfg.get("quantization").filter(|q| q.is_object()) else { return Ok(None) };
    let field =
        |k: &str| q.get(k).and_then(Value::as_u64).ok_or_else(|| Error::ConfigField(format!("quantization.{k}")));
    let (bits, group) = (field("bits")?, field("group_size")?);
    if let Some(mode) = q.get("mode").and_then(Value::as_str).filter(|m| *m != "affine") {
        return Err(Error::UnsupportedConfig(format!("MLX quantization mode {mode:?} (only affine)")));
    }
    if bits != 4 {
        return Err(Error::UnsupportedConfig(format!("MLX {bits}-bit quantization (only 4-bit is read)")));
    }
    QuantParams::new(Int4Scheme::Affine, group as usize)
        .map(Some)
        .map_err(|e| Error::UnsupportedConfig(format!("MLX quantization: {e}")))
}

fn exact_f16s(name: &str, what: &str, values: &[f32]) -> Result<Vec<f16>> {
    values
        .iter()
        .map(|&v| {
            let h = f16::from_f32(v);
            if h.to_f32() == v {
                Ok(h)
            } else {
                Err(Error::UnsupportedConfig(format!("MLX tensor `{name}`: {what} {v} is not an f16 value")))
            }
        })
        .collect()
}

/// The `[rows, cols]` int4 matrix of MLX tensor `name` from its packed words and its
/// `[rows, cols / group]` scales and biases (as f32).
pub fn int4_matrix(
    name: &str,
    params: QuantParams,
    rows: usize,
    cols: usize,
    words: &[u8],
    scales: &[f32],
    biases: &[f32],
) -> Result<Int4Matrix> {
    let groups = rows * cols.div_ceil(params.group_size);
    if words.len() != rows * cols / 2 || scales.len() != groups || biases.len() != groups {
        return Err(Error::UnsupportedConfig(format!("MLX tensor `{name}` does not hold a [{rows}, {cols}] matrix")));
    }
    Ok(Int4Matrix {
        rows,
        cols,
        params,
        packed: words.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect(),
        scales: exact_f16s(name, "scale", scales)?,
        mins: exact_f16s(name, "bias", biases)?,
    })
}
