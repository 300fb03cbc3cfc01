//! The f32 key/value cache of the reference forward pass.

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
    /// Whether keys and values are rounded to f16 as they are cached.
    f16: bool,
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
            f16: false,
        }
    }

    /// Rounds every key and value to f16 as it is cached, as the GPU's f16 KV cache holds
    /// them (grouped attention; an MLA GPU cache holds the latent instead of these keys).
    pub fn with_f16_rounding(mut self) -> KvCache {
        self.f16 = true;
        self
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
        let f16 = self.f16;
        let round = |x: &f32| if f16 { half::f16::from_f32(*x).to_f32() } else { *x };
        self.keys[layer].extend(k.iter().map(round));
        self.values[layer].extend(v.iter().map(round));
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
