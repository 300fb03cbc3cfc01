//! CPU decoding of one expert extent into f32 weights (reference and test use).

use super::{ExpertLayout, StoreError};

/// Dequantized `(gate, up, down)` f32 weights of one expert, row-major.
pub type DecodedExpert = (Vec<f32>, Vec<f32>, Vec<f32>);

/// Dequantized `(gate, up, down)` weights of an extent, row-major: gate and up are
/// `[intermediate, hidden]`, down is `[hidden, intermediate]`.
///
/// `bytes` is the extent (at least `layout.data_len` bytes). Fails with
/// [`StoreError::BufferTooSmall`] if it is shorter.
pub fn decode_expert(layout: &ExpertLayout, bytes: &[u8]) -> Result<DecodedExpert, StoreError> {
    if bytes.len() < layout.data_len {
        return Err(StoreError::BufferTooSmall { needed: layout.data_len, got: bytes.len() });
    }
    let dec = |name: &str, p: super::ProjectionLayout| {
        layout
            .encoding
            .decode(p.slice(bytes), p.rows, p.cols)
            .map_err(|source| StoreError::Quant { context: format!("decoding {name}"), source })
    };
    Ok((dec("gate_proj", layout.gate)?, dec("up_proj", layout.up)?, dec("down_proj", layout.down)?))
}
