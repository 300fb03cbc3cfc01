//! The f32 key/value cache of the reference forward pass.

/// Keys and values of every layer for the positions processed so far, each layer stored as
/// `[positions, kv_heads * head_dim]` row-major.
#[derive(Clone, Debug)]
pub struct KvCache {
    kv_dim: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
}

impl KvCache {
    /// An empty cache for `layers` layers of KV width `kv_dim`.
    pub fn new(layers: usize, kv_dim: usize) -> KvCache {
        KvCache { kv_dim, keys: vec![Vec::new(); layers], values: vec![Vec::new(); layers] }
    }

    /// Appends one position's key and value rows to layer `layer`.
    pub fn push(&mut self, layer: usize, k: &[f32], v: &[f32]) {
        assert!(k.len() == self.kv_dim && v.len() == self.kv_dim, "KvCache::push: row width");
        self.keys[layer].extend_from_slice(k);
        self.values[layer].extend_from_slice(v);
    }

    /// Positions cached in layer `layer`.
    pub fn len(&self, layer: usize) -> usize {
        self.keys[layer].len() / self.kv_dim.max(1)
    }

    /// Whether layer 0 holds no positions.
    pub fn is_empty(&self) -> bool {
        self.keys.first().is_none_or(Vec::is_empty)
    }

    /// Layer `layer`'s keys, `[len, kv_dim]`.
    pub fn keys(&self, layer: usize) -> &[f32] {
        &self.keys[layer]
    }

    /// Layer `layer`'s values, `[len, kv_dim]`.
    pub fn values(&self, layer: usize) -> &[f32] {
        &self.values[layer]
    }
}
