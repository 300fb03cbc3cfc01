//! Rounding a reference model's weights to what the GPU holds in a given format, so that
//! quantized GPU runs can be checked against an exact CPU computation on the same weights.

use super::ReferenceModel;
use crate::decoder::DecoderOptions;
use crate::error::Result;
use crate::model::layer_weights::{AttentionBlock, FfnWeights, MlaQuery, MlpWeights};
use crate::model::HostTensor;
use crate::ops::WeightFormat;

fn round(t: &mut HostTensor, format: WeightFormat) -> Result<()> {
    let (rows, cols) = match t.shape[..] {
        // GGUF matrices are read as stored: their dequantized values are what the GPU sees.
        _ if t.ggml.is_some() => return Ok(()),
        // So are int4 matrices stored in the format (MLX checkpoints).
        _ if t.int4.as_ref().is_some_and(|m| WeightFormat::Int4(m.params) == format) => return Ok(()),
        [r, c] => (r, c),
        _ => return Ok(()), // vectors (norms, biases) stay f32 on the GPU
    };
    t.data = format.round_trip(&t.data, rows, cols)?;
    Ok(())
}

fn round_mlp(m: &mut MlpWeights, format: WeightFormat) -> Result<()> {
    for t in [&mut m.gate, &mut m.up, &mut m.down] {
        round(t, format)?;
    }
    Ok(())
}

impl ReferenceModel {
    /// Replaces every matrix by its round trip through the format the GPU decoder built with
    /// `options` stores it in ([`DecoderOptions::format_of`]).
    pub fn rounded_like(mut self, options: &DecoderOptions) -> Result<ReferenceModel> {
        round(&mut self.embed, options.format_of("embed"))?;
        round(&mut self.lm_head, options.format_of("lm_head"))?;
        for l in &mut self.layers {
            let attention = options.format_of("attention");
            match &mut l.attn {
                AttentionBlock::Grouped(a) => {
                    for t in [&mut a.q, &mut a.k, &mut a.v, &mut a.o].into_iter().chain(a.gate.as_mut()) {
                        round(t, attention)?;
                    }
                }
                // Conv taps, A_log, dt_bias and the norm stay f32 (uploaded unconverted).
                AttentionBlock::Linear(a) => {
                    round(&mut a.in_proj, attention)?;
                    round(&mut a.out, attention)?;
                }
                AttentionBlock::Mla(a) => {
                    match &mut a.q {
                        MlaQuery::Direct(q) => round(q, attention)?,
                        MlaQuery::Compressed { a, b, .. } => {
                            round(a, attention)?;
                            round(b, attention)?;
                        }
                    }
                    // kv_b stays f32: the MLA kernel reads it unconverted.
                    for t in [&mut a.kv_a, &mut a.o].into_iter().chain(a.gate.as_mut()) {
                        round(t, attention)?;
                    }
                }
            }
            match &mut l.ffn {
                FfnWeights::Dense(m) => round_mlp(m, options.format_of("mlp"))?,
                FfnWeights::Moe(moe) => {
                    round(&mut moe.router, options.format_of("router"))?;
                    if let Some((m, gate)) = &mut moe.shared {
                        round_mlp(m, options.format_of("mlp"))?;
                        if let Some(gate) = gate {
                            round(gate, options.format_of("mlp"))?;
                        }
                    }
                }
            }
        }
        for layer in &mut self.experts {
            for e in layer {
                round_mlp(e, options.experts)?;
            }
        }
        Ok(self)
    }
}
