//! Greedy token choice on the GPU, so greedy decoding reads back 4 bytes, not the logits; and
//! its noisy variant, a sampled MTP draft's choice: the largest logit over the temperature plus
//! each token's Gumbel noise under the key the draft's verify row will draw with
//! ([`crate::util::rng::token_noise`]).

use super::{one_subgroup_layout, params};
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};

/// A bound argmax over the last token's logits.
pub struct Argmax {
    kernel: Kernel,
    /// The noisy variant's key and temperature ([`Argmax::set_noise`]).
    noise: Option<wgpu::Buffer>,
}

impl Argmax {
    /// Binds `logits` (`[tokens, vocab]`) → `out` (one u32).
    pub fn new(gpu: &Gpu, step: &wgpu::Buffer, logits: &wgpu::Buffer, out: &wgpu::Buffer, vocab: usize) -> Argmax {
        Self::bind(gpu, step, (logits, out), vocab, None)
    }

    /// The noisy variant over the same bindings: picks the largest `logit / temperature +
    /// token_noise(key, id)` under the key and temperature last set ([`Argmax::set_noise`]).
    pub fn with_noise(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        logits: &wgpu::Buffer,
        out: &wgpu::Buffer,
        vocab: usize,
    ) -> Argmax {
        let noise = gpu.storage("argmax noise", 16);
        Self::bind(gpu, step, (logits, out), vocab, Some(noise))
    }

    fn bind(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        (logits, out): (&wgpu::Buffer, &wgpu::Buffer),
        vocab: usize,
        noise: Option<wgpu::Buffer>,
    ) -> Argmax {
        let p = params(&[vocab as u32, 0, 0, 0]);
        let traffic = Traffic { fixed: 4 * vocab as u64, per_token: 0, per_position: 0 };
        // Rows of a multiple of 4 logits start on 16 bytes: read as vec4s.
        let defines: Vec<&str> = vocab
            .is_multiple_of(4)
            .then_some("VEC4")
            .into_iter()
            .chain(noise.is_some().then_some("NOISE"))
            .chain(one_subgroup_layout(gpu))
            .collect();
        let mut storage: Vec<Slice<'_>> = vec![logits.into(), out.into()];
        storage.extend(noise.as_ref().map(Slice::from));
        let kernel = Kernel::new(gpu, "argmax", &defines, step, &p, &storage);
        Argmax { kernel: kernel.with_traffic(traffic), noise }
    }

    /// Sets the noisy variant's key and temperature (> 0) for the dispatches of the next
    /// submission. Nothing for the plain argmax.
    pub fn set_noise(&self, gpu: &Gpu, key: u64, temperature: f32) {
        if let Some(noise) = &self.noise {
            let words = [key as u32, (key >> 32) as u32, (1.0 / temperature).to_bits(), 0];
            gpu.queue.write_buffer(noise, 0, bytemuck::cast_slice(&words));
        }
    }

    /// Records the argmax of the step's last token.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass) {
        self.kernel.dispatch(pass, 1, gpu.caps.max_workgroups_per_dim);
    }
}
