//! Running converted models: `experts.bin` streamed with tiny budgets equals resident, also
//! read uncached (O_DIRECT) by several threads with injected slow reads; a corrupted expert
//! extent surfaces as a checksum error mid-generation; Hugging Face directories run in int4 are
//! converted once into the cache and reused.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{fixtures, gpu, Rng};
use moestream::convert::{convert, ConvertOptions};
use moestream::experts::arena::SlotLayout;
use moestream::experts::source::ExpertSource;
use moestream::runtime::direct_io::DirectIo;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions};
use moestream::store::{AlignedBuf, StoreError};
use moestream::{Error, Result};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moestream-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn converted(fixture: &str, tag: &str) -> (PathBuf, Vec<u32>) {
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with(fixture)).unwrap();
    let out = temp_dir(tag);
    convert(&dir, &out, &ConvertOptions::default(), &mut |_| {}).unwrap();
    (out, golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens.clone())
}

fn engine(dir: &std::path::Path, budget: ExpertBudget) -> Engine {
    let mut o = EngineOptions::new(dir);
    o.budget = budget;
    o.io_threads = 2;
    Engine::load_on(gpu(), &o).unwrap()
}

#[test]
fn streamed_store_equals_resident() {
    let (dir, prompt) = converted("qwen3_moe", "conv-stream");
    let gen = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
    let resident = engine(&dir, ExpertBudget::Auto);
    let want = resident.generate(&prompt, &gen, |_, _| true).unwrap().tokens;
    let want_lp = resident.score(&prompt).unwrap().logprobs;
    drop(resident);
    for slots in [3, 4, 9] {
        let e = engine(&dir, ExpertBudget::Slots(slots));
        let g = e.generate(&prompt, &gen, |_, _| true).unwrap();
        assert_eq!(g.tokens, want, "{slots} slots");
        assert!(g.stats.experts.bytes_read > 0);
        assert_eq!(e.score(&prompt).unwrap().logprobs, want_lp, "{slots} slots");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn converted_hybrid_streams_its_store_exactly() {
    // Qwen3-Next (fused, key-head-grouped DeltaNet projections; dense layers between MoE
    // layers), Qwen3.5-MoE and Ling (KDA and MLA, Ling's tensor names) converted to int4: the
    // store streamed through one layer's top-k of slots, and through half the experts, equals
    // resident.
    for fixture in ["qwen3_next", "qwen3_5_moe", "ling"] {
        let (dir, prompt) = converted(fixture, &format!("conv-{fixture}"));
        let spec = moestream::model::ArchSpec::from_dir(&dir).unwrap();
        let moe = spec.moe.clone().unwrap();
        let total = spec.moe_layers.iter().filter(|m| **m).count() * moe.num_experts;
        let gen = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
        let resident = engine(&dir, ExpertBudget::Auto);
        let want = resident.generate(&prompt, &gen, |_, _| true).unwrap().tokens;
        let want_lp = resident.score(&prompt).unwrap().logprobs;
        drop(resident);
        for slots in [moe.top_k, total / 2] {
            let e = engine(&dir, ExpertBudget::Slots(slots));
            let g = e.generate(&prompt, &gen, |_, _| true).unwrap();
            assert_eq!(g.tokens, want, "{fixture}: {slots} slots");
            assert!(g.stats.experts.bytes_read > 0);
            assert_eq!(e.score(&prompt).unwrap().logprobs, want_lp, "{fixture}: {slots} slots");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// The store's reads delayed at random (up to 4 ms each, like a slow disk) and counted when
/// their buffer is not 4 KiB-aligned (an O_DIRECT store would then read through the page cache).
struct SlowDisk {
    inner: Arc<dyn ExpertSource>,
    rng: Mutex<Rng>,
    misaligned: Arc<AtomicUsize>,
}

impl ExpertSource for SlowDisk {
    fn read(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()> {
        if !(buf.as_ptr() as usize).is_multiple_of(AlignedBuf::ALIGN) {
            self.misaligned.fetch_add(1, Ordering::SeqCst);
        }
        let micros = self.rng.lock().unwrap().below(4000);
        std::thread::sleep(Duration::from_micros(micros as u64));
        self.inner.read(layer, expert, buf)
    }
    fn read_len(&self) -> usize {
        self.inner.read_len()
    }
    fn disk_bytes(&self) -> u64 {
        self.inner.disk_bytes()
    }
    fn layout(&self) -> SlotLayout {
        self.inner.layout()
    }
    fn layer_layout(&self, layer: usize) -> SlotLayout {
        self.inner.layer_layout(layer)
    }
}

/// The bigger-than-memory path at small scale: O_DIRECT, four reader threads, slow reads and a
/// bounded cache give the resident tokens and log-probabilities, every read lands in an aligned
/// buffer, and the I/O counters add up.
#[test]
fn uncached_store_with_slow_reads_and_bounded_cache_is_exact() {
    let (dir, prompt) = converted("qwen3_moe", "conv-slow-direct");
    let gen = GenerateOptions { max_tokens: 8, ignore_eos: true, ..Default::default() };
    let resident = engine(&dir, ExpertBudget::Auto);
    let want = resident.generate(&prompt, &gen, |_, _| true).unwrap().tokens;
    let want_lp = resident.score(&prompt).unwrap().logprobs;
    drop(resident);
    for (seed, slots) in [(1, 3), (2, 5)] {
        let misaligned = Arc::new(AtomicUsize::new(0));
        let wrap = |inner: Arc<dyn ExpertSource>| -> Arc<dyn ExpertSource> {
            Arc::new(SlowDisk { inner, rng: Mutex::new(Rng::new(seed)), misaligned: misaligned.clone() })
        };
        let mut o = EngineOptions::new(&dir);
        o.budget = ExpertBudget::Slots(slots);
        o.io_threads = 4;
        o.direct_io = DirectIo::On;
        let e = Engine::load_with_experts(gpu(), &o, &wrap).unwrap();
        let g = e.generate(&prompt, &gen, |_, _| true).unwrap();
        assert_eq!(g.tokens, want, "{slots} slots");
        assert_eq!(e.score(&prompt).unwrap().logprobs, want_lp, "{slots} slots");
        assert_eq!(misaligned.load(Ordering::SeqCst), 0, "every read buffer is 4 KiB-aligned");
        let s = e.expert_stats();
        assert!(s.stall_ms > 0.0 && s.io_busy_ms > 0.0 && s.io_read_ms >= s.io_busy_ms * 0.99, "{s:?}");
        assert!(s.bytes_read >= s.needed_bytes && s.needed_bytes > 0, "{s:?}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn corrupted_extent_is_a_checksum_error_mid_generation() {
    let (dir, prompt) = converted("mixtral", "conv-corrupt");
    let store = dir.join("experts.bin");
    let mut bytes = std::fs::read(&store).unwrap();
    let n = bytes.len();
    bytes[n - 4096 * 3 + 100] ^= 0x5a; // inside one of the last extents
    std::fs::write(&store, &bytes).unwrap();
    let mut o = EngineOptions::new(&dir);
    o.budget = ExpertBudget::Slots(2);
    // The size still matches the manifest, so loading succeeds; the first read of that expert fails.
    let e = Engine::load_on(gpu(), &o).unwrap();
    let gen = GenerateOptions { max_tokens: 200, ignore_eos: true, ..Default::default() };
    let mut failed = false;
    for _ in 0..4 {
        match e.generate(&prompt, &gen, |_, _| true) {
            Err(Error::Store(StoreError::Checksum { .. })) => {
                failed = true;
                break;
            }
            Err(other) => panic!("expected a checksum error, got {other}"),
            Ok(_) => {}
        }
    }
    assert!(failed, "the corrupted expert was never read");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn hf_dir_in_int4_is_converted_once_into_the_cache() {
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with("olmoe")).unwrap();
    let cache = temp_dir("conv-cache");
    let mut o = EngineOptions::new(&dir).with_format(moestream::ops::WeightFormat::Int4(Default::default()));
    o.cache_dir = Some(cache.clone());
    let prompt = &golden.prompts[1].tokens;
    let first = Engine::load_on(gpu(), &o).unwrap().score(prompt).unwrap().logprobs;
    let entries: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert_eq!(entries.len(), 1, "one cached conversion");
    let manifest = entries[0].as_ref().unwrap().path().join("model.json");
    let stamp = std::fs::metadata(&manifest).unwrap().modified().unwrap();
    let second = Engine::load_on(gpu(), &o).unwrap().score(prompt).unwrap().logprobs;
    assert_eq!(first, second);
    assert_eq!(std::fs::metadata(&manifest).unwrap().modified().unwrap(), stamp, "the cache was reused");
    std::fs::remove_dir_all(cache).unwrap();
}
