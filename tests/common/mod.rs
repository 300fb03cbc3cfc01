//! Helpers shared by the integration tests: fixture discovery and golden-file parsing.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use moestream::gpu::{Gpu, GpuOptions, Pass};

pub mod child;
pub mod logits;
pub mod mixtral;

/// One recorded prompt of a golden file.
#[derive(serde::Deserialize, Clone, Debug)]
pub struct GoldenPrompt {
    pub name: String,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub last_logprobs: Vec<f32>,
    pub greedy: Vec<u32>,
    #[serde(default)]
    pub text: Option<String>,
}

/// A fixture's golden.json.
#[derive(serde::Deserialize, Clone, Debug)]
pub struct Golden {
    pub architecture: String,
    pub prompts: Vec<GoldenPrompt>,
}

/// A temporary directory `moestream-{tag}-{pid}-{n}`, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty directory.
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("moestream-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The fixtures directory.
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Every fixture directory with a golden.json, sorted.
pub fn fixtures() -> Vec<(PathBuf, Golden)> {
    let mut out: Vec<(PathBuf, Golden)> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("golden.json").exists())
        .map(|p| {
            let g = serde_json::from_str(&std::fs::read_to_string(p.join("golden.json")).unwrap()).unwrap();
            (p, g)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no fixtures found");
    out
}

/// A GPU context held in `cell`, opened with `options` on first use (once per test binary).
fn opened_once(cell: &'static std::sync::OnceLock<std::sync::Arc<Gpu>>, options: GpuOptions) -> std::sync::Arc<Gpu> {
    cell.get_or_init(|| Gpu::new(&options).expect("a Vulkan adapter (lavapipe) is required")).clone()
}

/// The GPU used by tests (lavapipe in CI), opened once per test binary.
pub fn gpu() -> std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    opened_once(&GPU, GpuOptions::default())
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

// ---------------------------------------------------------------------------------------------
// Kernel-test helpers (tests/kernels_*.rs): deterministic random data, one-pass submission,
// typed uploads/readbacks and tolerance checks against the CPU reference.

/// A small deterministic xorshift64* generator (no external crate needed).
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// `n` values uniform in [lo, hi).
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.range(lo, hi)).collect()
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// A GPU whose storage bindings are capped at 4096 bytes, so weight matrices and the expert
/// arena are split into many chunks (opened once per test binary).
pub fn gpu_chunked() -> std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    opened_once(&GPU, GpuOptions { max_binding_override: Some(4096), ..Default::default() })
}

/// The adapter with dense prefill steps in the tiled GEMM (`matmul`), which CPU adapters
/// otherwise run through the decode matvec ([`moestream::gpu::Caps::tiled_prefill`]).
pub fn gpu_tiled_prefill() -> std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    opened_once(&GPU, GpuOptions { tiled_prefill: true, ..Default::default() })
}

/// The adapter with the delta rule token by token in steps of several tokens too
/// ([`moestream::gpu::Caps::chunked_delta_rule`] off).
pub fn gpu_sequential_delta_rule() -> std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    opened_once(&GPU, GpuOptions { sequential_delta_rule: true, ..Default::default() })
}

/// A GPU with subgroup operations disabled, so the shared-memory fallback kernels run.
pub fn gpu_no_subgroups() -> std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    opened_once(&GPU, GpuOptions { disable_subgroups: true, ..Default::default() })
}

/// The adapter with the kernel layouts of a hardware GPU (teams of lanes summed by subgroup
/// shuffles, gathered expert prefill), so the kernels GPUs run are tested on lavapipe too.
pub fn gpu_layouts() -> std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    opened_once(&GPU, GpuOptions { gpu_layouts: true, ..Default::default() })
}

/// GPU layouts with 32-lane teams (what NVIDIA, AMD and Apple GPUs get), summed through
/// workgroup memory on lavapipe, whose subgroups have 8 lanes.
pub fn gpu_layouts_team32() -> std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    opened_once(&GPU, GpuOptions { gpu_layouts: true, decode_team: Some(32), ..Default::default() })
}

/// GPU layouts without subgroups: teams summed through workgroup memory.
pub fn gpu_layouts_no_subgroups() -> std::sync::Arc<Gpu> {
    static GPU: std::sync::OnceLock<std::sync::Arc<Gpu>> = std::sync::OnceLock::new();
    opened_once(&GPU, GpuOptions { gpu_layouts: true, disable_subgroups: true, ..Default::default() })
}

/// The two layouts of the kernels built on shaders/reduce.wgsl (argmax, router_topk,
/// token_logprob), each with a name: the adapter as it runs (on lavapipe 8-lane workgroups reduced
/// by subgroup operations) and the GPU layouts (64 lanes reduced as a tree in workgroup memory).
pub fn reduce_layouts() -> [(&'static str, std::sync::Arc<Gpu>); 2] {
    [("default layout", gpu()), ("GPU layouts", gpu_layouts())]
}

/// Records whatever `f` puts in one compute pass, submits it (read-backs wait for it).
pub fn submit(gpu: &Gpu, f: impl FnOnce(&mut Pass)) {
    let mut pass = Pass::new(&gpu.device);
    f(&mut pass);
    pass.submit(&gpu.queue);
}

/// A storage buffer holding `data`.
pub fn upload_f32(gpu: &Gpu, data: &[f32]) -> wgpu::Buffer {
    gpu.upload("test f32", bytemuck::cast_slice(data))
}

/// A storage buffer holding `data`.
pub fn upload_u32(gpu: &Gpu, data: &[u32]) -> wgpu::Buffer {
    gpu.upload("test u32", bytemuck::cast_slice(data))
}

/// Reads `count` f32 values back.
pub fn read_f32(gpu: &Gpu, buf: &wgpu::Buffer, count: usize) -> Vec<f32> {
    gpu.read_f32(buf, 0, count).expect("readback")
}

/// Reads `count` u32 values back.
pub fn read_u32(gpu: &Gpu, buf: &wgpu::Buffer, count: usize) -> Vec<u32> {
    read_f32(gpu, buf, count).into_iter().map(f32::to_bits).collect()
}

/// The values after a round trip through f16 (what an f16 weight upload holds).
pub fn f16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// Normalised mean squared error `sum (got-want)^2 / sum want^2`.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let num: f64 = got.iter().zip(want).map(|(g, w)| ((g - w) as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|w| (*w as f64).powi(2)).sum();
    num / den.max(1e-30)
}

/// Asserts `|got - want| <= tol * (1 + |want|)` element-wise (NaN fails), naming the worst
/// element on failure.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length mismatch");
    let mut worst = (0usize, 0.0f32);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / (1.0 + w.abs());
        if err.is_nan() || err > worst.1 {
            worst = (i, if err.is_nan() { f32::INFINITY } else { err });
        }
    }
    let (i, err) = worst;
    assert!(
        err <= tol,
        "{what}: |Δ| ≤ {tol:e}·(1+|ref|) violated at [{i}]: got {} want {} (scaled err {err:e}, \
         NMSE {:e})",
        got[i],
        want[i],
        nmse(got, want)
    );
}

/// Asserts bit-exact equality, naming the first differing element.
pub fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length mismatch");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!("{what}: not bit-identical at [{i}]: got {} want {}", got[i], want[i]);
    }
}

/// Every weight format the kernels read: f32, f16, int4 affine (groups of 32) and int4
/// symmetric (groups of 64).
pub fn weight_formats() -> [moestream::ops::WeightFormat; 4] {
    use moestream::ops::WeightFormat;
    use moestream::quant::{Int4Scheme, QuantParams};
    [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::Int4(QuantParams { scheme: Int4Scheme::Affine, group_size: 32 }),
        WeightFormat::Int4(QuantParams { scheme: Int4Scheme::Symmetric, group_size: 64 }),
    ]
}

/// The formats the CPU layout's decode kernels read two scale groups a step (`LANE_WIDE`): f16
/// and int4 in groups of 32 (of [`weight_formats`]).
pub fn lane_wide_formats() -> [moestream::ops::WeightFormat; 2] {
    let [_, f16, int4_g32, _] = weight_formats();
    [f16, int4_g32]
}

/// The values a `[rows, cols]` matrix holds once stored in `format` (f16-rounded, or
/// quantized and dequantized by the CPU codec), for running the reference on what the GPU sees.
pub fn as_stored(format: moestream::ops::WeightFormat, w: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    match format.encoding() {
        None => w.to_vec(),
        Some(enc) => {
            let bytes = format.encode(w, rows, cols).expect("encode");
            enc.decode(&bytes, rows, cols).expect("decode")
        }
    }
}

/// Uploads a row-major `[rows, cols]` f32 matrix in `format` (chunked by the binding limit).
pub fn upload_matrix(
    gpu: &Gpu,
    data: &[f32],
    rows: usize,
    cols: usize,
    format: moestream::ops::WeightFormat,
) -> moestream::ops::GpuMatrix {
    let t = moestream::model::weights::HostTensor::new(vec![rows, cols], data.to_vec());
    moestream::ops::GpuMatrix::upload(gpu, "test matrix", &t, format).expect("matrix upload")
}

/// A copy of the fixture model `fixture` (its files copied: small, and links are not portable) whose `tokenizer.json` has the
/// special tokens `specials`: the fixtures' tokenizers lack the chat formats' marker tokens,
/// and their vocabulary fills the model's logits, so each marker takes the id of a byte-level
/// token no UTF-8 text uses (bytes 0xC0, 0xC1, 0xF5 to 0xFF) and no merge makes. Returns the
/// directory and each marker's id.
pub fn with_special_tokens(fixture: &Path, specials: &[&str]) -> (TempDir, Vec<(u32, String)>) {
    use serde_json::{json, Value};
    let dir = TempDir::new("special-tokens");
    for entry in std::fs::read_dir(fixture).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        if name != "tokenizer.json" && name != "golden.json" {
            std::fs::copy(&path, dir.path().join(name)).unwrap();
        }
    }
    let mut tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("tokenizer.json")).unwrap()).unwrap();
    // Byte-level BPE writes bytes 0xA1..=0xFF as the characters of the same code points.
    let unused: Vec<String> =
        [0xC0u32, 0xC1].into_iter().chain(0xF5..=0xFF).map(|b| char::from_u32(b).unwrap().to_string()).collect();
    assert!(specials.len() <= unused.len(), "at most {} special tokens", unused.len());
    let merges = tokenizer["model"]["merges"].to_string();
    let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
    let mut ids = Vec::new();
    for (special, byte) in specials.iter().zip(&unused) {
        assert!(!merges.contains(byte.as_str()), "a merge uses {byte:?}");
        let id = vocab.remove(byte).unwrap_or_else(|| panic!("{byte:?} is in the vocabulary")).as_u64().unwrap();
        vocab.insert(special.to_string(), json!(id));
        ids.push((id as u32, special.to_string()));
    }
    let added = tokenizer["added_tokens"].as_array_mut().unwrap();
    for (id, content) in &ids {
        added.push(json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
                          "normalized": false, "special": true}));
    }
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    (dir, ids)
}

/// DeepSeek-V3's tool-call marker tokens, spelled as its tokenizer spells them (written here,
/// not taken from the library, so the tests check its spelling).
pub const DEEPSEEK_TOOL_MARKERS: &[&str] = &[
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
];
