//! Writing a step's keys and values into one chunk of a sequence's KV cache, in the cache's
//! element type ([`KvDtype`]), head-major (see `shaders/kv_store.wgsl`).

use super::rope::RopeLayout;
use super::{groups64, params};
use crate::gpu::kernel::Slice;
use crate::gpu::profiler::Traffic;
use crate::gpu::{Gpu, Kernel, Pass};
use crate::model::RopeSpec;

use crate::quant::kv_dtype::Q8Rows;
pub use crate::quant::KvDtype;

/// The shader defines selecting `dtype` in the cache kernels: `Q8` is the quantized layout
/// (codes, then block scales: [`Q8Rows`]), with `Q4` its codes are four bits.
pub(crate) fn dtype_defines(dtype: KvDtype) -> &'static [&'static str] {
    match dtype {
        KvDtype::F16 => &["F16"],
        KvDtype::F32 => &[],
        KvDtype::Q8_0 => &["Q8"],
        KvDtype::Q4_0 => &["Q8", "Q4"],
    }
}

/// The q8_0 layout words of rows of `width` values for the cache kernels' parameters: values
/// per block and scales per word (unused by other element types).
pub(crate) fn q8_words(width: usize) -> [u32; 2] {
    let rows = Q8Rows::of(width);
    [rows.block as u32, rows.scales_per_word() as u32]
}

/// One chunk of a layer's KV cache: KV heads `kv_head0 .. kv_head0 + heads`, `context`
/// positions each, in `k` and `v` (each within the binding limit). A ring holds position `j`
/// in row `j % context` (a sliding-window layer keeping only its window and a step).
#[derive(Clone, Copy)]
pub struct KvChunk<'a> {
    /// Keys.
    pub k: &'a wgpu::Buffer,
    /// Values.
    pub v: &'a wgpu::Buffer,
    /// First KV head held.
    pub kv_head0: usize,
    /// KV heads held.
    pub heads: usize,
    /// Positions per head.
    pub context: usize,
    /// Element type.
    pub dtype: KvDtype,
    /// Positions wrap around the `context` rows.
    pub ring: bool,
}

impl KvChunk<'_> {
    /// The shader defines of the chunk's element type and layout.
    pub(crate) fn defines(&self) -> Vec<&'static str> {
        let mut defines = dtype_defines(self.dtype).to_vec();
        defines.extend(self.ring.then_some("RING"));
        defines
    }
}

/// A grouped-attention layer's RoPE, which its cache store applies ([`KvStore::new`]): keys
/// rotated as they are cached, the chunk's query heads in place.
#[derive(Clone, Copy)]
pub struct StoreRope<'a> {
    /// cos and sin tables from [`RopeSpec::tables`].
    pub tables: (&'a wgpu::Buffer, &'a wgpu::Buffer),
    /// The step's queries, `[tokens, n_heads * head_dim]`.
    pub q: &'a wgpu::Buffer,
    /// Query heads (a multiple of the KV heads).
    pub n_heads: usize,
    /// The rotary width and pair layout (rotating each head from its first value).
    pub spec: &'a RopeSpec,
}

/// A bound store of the step's `k`/`v` rows into one chunk.
pub struct KvStore {
    kernel: Kernel,
    pairs_per_token: usize,
}

impl KvStore {
    /// Binds `k` (`[tokens, n_kv_heads * k_dim]` f32) and `v` (`[tokens, n_kv_heads * v_dim]`)
    /// to `chunk`; `(k_dim, v_dim)` are even (equal for grouped attention; MLA's latent and
    /// rotary key for its one latent "head").
    pub fn new(
        gpu: &Gpu,
        step: &wgpu::Buffer,
        (k, v): (&wgpu::Buffer, &wgpu::Buffer),
        chunk: KvChunk<'_>,
        n_kv_heads: usize,
        (k_dim, v_dim): (usize, usize),
        rope: Option<StoreRope<'_>>,
    ) -> KvStore {
        assert!(k_dim.is_multiple_of(2) && v_dim.is_multiple_of(2), "cache rows are stored in pairs");
        let mut words = vec![
            n_kv_heads as u32,
            k_dim as u32,
            v_dim as u32,
            chunk.kv_head0 as u32,
            chunk.heads as u32,
            chunk.context as u32,
        ];
        words.extend(q8_words(k_dim));
        words.extend(q8_words(v_dim));
        let mut storage: Vec<Slice> = vec![k.into(), v.into(), chunk.k.into(), chunk.v.into()];
        let mut defines = chunk.defines();
        // Per token: the chunk's f32 rows read and their cached copies written.
        let rows_written = chunk.dtype.row_bytes(k_dim) + chunk.dtype.row_bytes(v_dim);
        let mut per_token = (chunk.heads * (4 * (k_dim + v_dim) + rows_written)) as u64;
        // Invocations per token: a pair of dims, or (q8_0, q4_0) a scale word's blocks, of the
        // wider row.
        let units = match chunk.dtype.is_quantized() {
            true => Q8Rows::of(k_dim).scale_words().max(Q8Rows::of(v_dim).scale_words()),
            false => k_dim.max(v_dim) / 2,
        };
        let mut pairs_per_token = chunk.heads * units;
        if let Some(r) = rope {
            // The query heads of the chunk's KV heads (grouped: k_dim is the head dim).
            let group = r.n_heads / n_kv_heads;
            let q_heads = RopeLayout {
                n_heads: chunk.heads * group,
                head_stride: k_dim,
                row_stride: r.n_heads * k_dim,
                offset: chunk.kv_head0 * group * k_dim,
                at_cache_pos: false,
            };
            words.extend([r.spec.rotary_dim as u32, r.spec.interleaved as u32, 0, 0, 0, 0]);
            words.extend(q_heads.words());
            storage.extend([Slice::from(r.tables.0), r.tables.1.into(), r.q.into()]);
            defines.push("ROPE");
            pairs_per_token += q_heads.n_heads * r.spec.rotary_dim / 2;
            per_token += q_heads.bytes_per_token(r.spec.rotary_dim);
        }
        let traffic = Traffic { fixed: 0, per_token, per_position: 0 };
        let kernel = Kernel::new(gpu, "kv_store", &defines, step, &params(&words), &storage).with_traffic(traffic);
        KvStore { kernel, pairs_per_token }
    }

    /// Records the store of `n_tokens` rows.
    pub fn record(&self, gpu: &Gpu, pass: &mut Pass, n_tokens: usize) {
        self.kernel.dispatch(pass, groups64(n_tokens * self.pairs_per_token), gpu.caps.max_workgroups_per_dim);
    }
}
