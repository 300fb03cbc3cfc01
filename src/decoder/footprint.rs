//! What one decode token reads of the weights, for roofline figures.

use super::GpuModel;

impl GpuModel {
    /// Bytes of weights a one-token step reads: every resident matrix on the GPU except the
    /// embedding table (of which it reads one row), and one layer's top-k routed experts per
    /// MoE layer.
    pub fn weight_bytes_per_token(&self) -> u64 {
        let resident: u64 = self.matrices.iter().skip(1).flat_map(|m| &m.chunks).map(|c| c.buffer.size()).sum();
        let experts = match (&self.spec.moe, self.residency()) {
            (Some(m), Some(r)) => {
                let moe_layers = self.spec.moe_layers.iter().filter(|&&x| x).count();
                (moe_layers * m.top_k * r.arena.layout.slot_bytes) as u64
            }
            _ => 0,
        };
        resident + experts
    }
}
