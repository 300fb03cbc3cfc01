//! Streaming under stress: one I/O thread with random read delays and a tiny budget still gives
//! the resident output; a read failure mid-generation surfaces as an error, never as text.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{fixtures, gpu, Rng};
use moestream::experts::arena::SlotLayout;
use moestream::experts::policy::PolicyKind;
use moestream::experts::predictor::PrefetchKind;
use moestream::experts::source::ExpertSource;
use moestream::ops::WeightFormat;
use moestream::runtime::{Engine, EngineOptions, ExpertBudget, GenerateOptions};
use moestream::{Error, Result};

/// Wraps a source with random delays and failures of reads number `fail_after .. +3`.
struct Faulty {
    inner: Arc<dyn ExpertSource>,
    rng: Mutex<Rng>,
    reads: AtomicUsize,
    fail_after: Option<usize>,
}

const FAILED_READS: usize = 3;

impl ExpertSource for Faulty {
    fn read(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<()> {
        let n = self.reads.fetch_add(1, Ordering::SeqCst);
        if self.fail_after.is_some_and(|f| (f..f + FAILED_READS).contains(&n)) {
            return Err(Error::io("experts.bin", std::io::Error::other("injected read failure")));
        }
        let micros = self.rng.lock().unwrap().below(3000);
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

fn options(dir: &std::path::Path, budget: ExpertBudget) -> EngineOptions {
    let mut o = EngineOptions::new(dir).with_format(WeightFormat::F32);
    o.budget = budget;
    o.policy = PolicyKind::Eamc;
    o.prefetch = PrefetchKind::Eamc;
    o.io_threads = 1;
    o
}

#[test]
fn one_thread_random_delays_tiny_budget_is_exact() {
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with("qwen3_moe")).unwrap();
    let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
    let gen = GenerateOptions { max_tokens: 10, ignore_eos: true, ..Default::default() };
    let want = Engine::load_on(gpu(), &options(&dir, ExpertBudget::Auto))
        .unwrap()
        .generate(prompt, &gen, |_, _| true)
        .unwrap();
    for seed in 1..=3 {
        let wrap = |inner: Arc<dyn ExpertSource>| -> Arc<dyn ExpertSource> {
            Arc::new(Faulty { inner, rng: Mutex::new(Rng::new(seed)), reads: AtomicUsize::new(0), fail_after: None })
        };
        let e = Engine::load_with_experts(gpu(), &options(&dir, ExpertBudget::Slots(3)), &wrap).unwrap();
        let got = e.generate(prompt, &gen, |_, _| true).unwrap();
        assert_eq!(got.tokens, want.tokens, "seed {seed}");
        assert!(got.stats.experts.stall_ms > 0.0);
    }
}

#[test]
fn read_failure_mid_generation_is_an_error_and_the_engine_recovers() {
    let (dir, golden) = fixtures().into_iter().find(|(d, _)| d.ends_with("mixtral")).unwrap();
    let prompt = &golden.prompts.iter().find(|p| p.name == "short").unwrap().tokens;
    let wrap = |inner: Arc<dyn ExpertSource>| -> Arc<dyn ExpertSource> {
        Arc::new(Faulty { inner, rng: Mutex::new(Rng::new(9)), reads: AtomicUsize::new(0), fail_after: Some(40) })
    };
    let e = Engine::load_with_experts(gpu(), &options(&dir, ExpertBudget::Slots(2)), &wrap).unwrap();
    let mut streamed = 0;
    let gen = GenerateOptions { max_tokens: 64, ignore_eos: true, ..Default::default() };
    let err = e.generate(prompt, &gen, |_, _| {
        streamed += 1;
        true
    });
    match err {
        Err(Error::Io { source, .. }) => assert!(source.to_string().contains("injected"), "{source}"),
        other => panic!("expected the injected I/O error, got {other:?}"),
    }
    assert!(streamed < 64, "generation must stop at the failure");
    // The failed experts were forgotten, not left mapped to stale slots: once reads work
    // again the same engine gives the resident output.
    let want = Engine::load_on(gpu(), &options(&dir, ExpertBudget::Auto))
        .unwrap()
        .generate(prompt, &gen, |_, _| true)
        .unwrap();
    let again = (0..=FAILED_READS).find_map(|_| e.generate(prompt, &gen, |_, _| true).ok()).expect("reads recover");
    assert_eq!(again.tokens, want.tokens);
}
