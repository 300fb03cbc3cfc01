//! The f32 key/value cache of the reference forward pass.

use crate::quant::KvDtype;

/// Keys and values of every layer for the positions processed so far, each layer stored as
/// `[positions, k_dim]` and `[positions, v_dim]` row-major. MLA layers cache their decompressed
/// per-head keys and values here (the reference's plain form; the GPU caches the latent).
#[derive(Clone, Debug)]
pub struct KvCache {
    k_dim: usize,
    v_dim: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// Per layer, a Gated DeltaNet layer's state (conv window + recurrent state; empty for
    /// other layers).
    states: Vec<Vec<f32>>,
    /// What keys and values are rounded to as they are cached, row by row of `row` values
    /// (`row` 0: MLA, whose latent rows are rounded instead, [`KvCache::round_latent`]).
    round: (KvDtype, usize),
}

/// `x` as a cache of `dtype` holds it, in rows of `row` values.
fn rounded(x: &[f32], dtype: KvDtype, row: usize) -> Vec<f32> {
    x.chunks(row).flat_map(|r| dtype.round_trip(r)).collect()
}

impl KvCache {
    /// An empty cache for `layers` layers of key width `k_dim` and value width `v_dim`.
    pub fn new(layers: usize, k_dim: usize, v_dim: usize) -> KvCache {
        KvCache {
            k_dim,
            v_dim,
            keys: vec![Vec::new(); layers],
            values: vec![Vec::new(); layers],
            states: vec![Vec::new(); layers],
            round: (KvDtype::F32, 1),
        }
    }

    /// Rounds every key and value to `dtype` as it is cached, as the GPU's cache of that type
    /// holds them, rows of `row` values (a head) at a time; `row` 0 (MLA, whose GPU cache holds
    /// the latent, not these keys) rounds nothing here, the latent through
    /// [`KvCache::round_latent`] instead.
    pub fn with_rounding(mut self, dtype: KvDtype, row: usize) -> KvCache {
        self.round = (dtype, row);
        self
    }

    /// Rounds an MLA layer's normalised latent `c` and rotated key `k_rope` as the GPU's latent
    /// cache holds them (each a row of its own), before they are decompressed into the keys and
    /// values this cache holds.
    pub fn round_latent(&self, c: &mut [f32], k_rope: &mut [f32]) {
        let dtype = self.round.0;
        for x in [c, k_rope] {
            let r = rounded(x, dtype, x.len());
            x.copy_from_slice(&r);
        }
    }

    /// Gives every Gated DeltaNet layer of `spec` a zeroed state.
    pub fn with_linear_states(mut self, spec: &crate::model::ArchSpec) -> KvCache {
        if let Some(hy) = &spec.hybrid {
            for (i, s) in self.states.iter_mut().enumerate() {
                *s = if hy.is_linear(i) { vec![0.0; hy.state_floats()] } else { Vec::new() };
            }
        }
        self
    }

    /// Layer `layer`'s Gated DeltaNet state (empty for other layers).
    pub fn linear_state(&mut self, layer: usize) -> &mut [f32] {
        &mut self.states[layer]
    }

    /// Appends one position's key and value rows to layer `layer`.
    pub fn push(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        assert!(k.len() == self.k_dim && v.len() == self.v_dim, "KvCache::push: row width");
        match self.round {
            (dtype, row) if row > 0 => {
                self.keys[layer].extend(rounded(k, dtype, row));
                self.values[layer].extend(rounded(v, dtype, row));
            }
            _ => {
                self.keys[layer].extend_from_slice(k);
                self.values[layer].extend_from_slice(v);
            }
        }
    }

    /// Positions cached in layer `layer`.
    pub fn len(&self, layer: usize) -> usize {
        self.keys[layer].len() / self.k_dim.max(1)
    }

    /// Whether layer 0 holds no positions.
    pub fn is_empty(&self) -> bool {
        self.keys.first().is_none_or(Vec::is_empty)
    }

    /// Layer `layer`'s keys, `[len, k_dim]`.
    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.keys[layer]
    }

    /// Layer `layer`'s values, `[len, v_dim]`.
    pub fn values(&self, layer: usize) -> &[f32] {
        &self.values[layer]
    }
}
