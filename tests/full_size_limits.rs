//! Issue 47's full-size shape (a 35B-A3B-like hybrid MoE: 40 MoE layers of 256 experts, top-8,
//! hidden 2048, expert width 512, ~20 GB of int4 experts) at a size CI holds: an expert store
//! whose extents lie past 4 GiB (a sparse file), the cache model over all 10,240 experts with
//! 25% of them in slots under LRU and EAMC, and the EAM tracker at 40 × 256 with a full
//! collection of 300. Sizes and counts are asserted; times are only printed.

mod common;

use std::collections::HashSet;
use std::fs::File;
use std::path::Path;
use std::time::Instant;

use common::{Rng, TempDir};
use moestream::experts::eam::{EamCollection, EamTracker, DEFAULT_EAMC_CAPACITY, DEFAULT_MATCHES};
use moestream::experts::policy::{ExpertId, Phase, PolicyKind};
use moestream::experts::predictor::PrefetchKind;
use moestream::experts::trace::{Trace, TraceEvent, TraceHeader, TraceStep};
use moestream::quant::{QuantParams, WeightEncoding};
use moestream::sim::{access_sequence, replay_observed, simulate, SimConfig};
use moestream::store::{
    ExpertLayout, ExpertStore, IoMode, OpenOptions, StoreEncoding, StoreInfo, StoreWriter, FIXED_HEADER_LEN,
    INDEX_ENTRY_LEN,
};

const LAYERS: usize = 40;
const EXPERTS: usize = 256;
const TOP_K: usize = 8;
const HIDDEN: usize = 2048;
const EXPERT_WIDTH: usize = 512;
/// A quarter of the 10,240 experts.
const SLOTS: usize = LAYERS * EXPERTS / 4;
const GIB4: u64 = 1 << 32;

fn int4() -> WeightEncoding {
    WeightEncoding::Int4(QuantParams::default())
}

#[test]
fn the_full_size_store_passes_4_gib() {
    // One expert extent of the full-size model, and the store's end: the offsets a reader
    // handles are far past u32.
    let extent = ExpertLayout::new(int4(), HIDDEN, EXPERT_WIDTH).unwrap().extent_len as u64;
    let end = (LAYERS * EXPERTS) as u64 * extent;
    println!(
        "full size: {} experts of {extent} bytes, {:.1} GiB of extents",
        LAYERS * EXPERTS,
        end as f64 / 2f64.powi(30)
    );
    assert!(end > 4 * GIB4);
}

/// Small experts, so a store of them is quick to write: hidden 128, width 64.
const SMALL: (usize, usize) = (128, 64);
const HASH: u64 = 0x4747_4747;

/// Deterministic weights of one projection.
fn weights(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    rng.vec(n, -0.1, 0.1)
}

/// A store of model layers 0 and 39, three experts each, written as usual.
fn write_small_store(path: &Path) -> ExpertStore {
    let info = StoreInfo {
        arch_hash: HASH,
        layers: vec![0, 39],
        experts_per_layer: 3,
        hidden: SMALL.0,
        intermediate: SMALL.1,
        encoding: StoreEncoding::Uniform(int4()),
    };
    let mut w = StoreWriter::create(path, info).unwrap();
    let n = SMALL.0 * SMALL.1;
    for layer in [0, 39] {
        for e in 0..3 {
            let seed = (layer * 8 + e) as u64 * 3;
            w.write_expert(layer, e, &weights(seed, n), &weights(seed + 1, n), &weights(seed + 2, n)).unwrap();
        }
    }
    w.finish().unwrap();
    ExpertStore::open(path, HASH).unwrap()
}

/// `store`'s file with its extents moved to `offsets` (in index order) in a sparse file as long
/// as the last one's end: the header region is copied with the index entries' offsets replaced
/// and the region crc recomputed (the layout of `moestream::store`), every extent copied.
fn relocate(store: &ExpertStore, offsets: &[u64], out: &Path) {
    let src = std::fs::read(store.path()).unwrap();
    let layers = store.layers().len();
    let index_at = FIXED_HEADER_LEN + 4 * layers;
    let region_len = index_at + INDEX_ENTRY_LEN * offsets.len() + 4;
    let mut region = src[..region_len].to_vec();
    let extent = store.extent_len() as u64;
    let mut extents = Vec::new();
    for (i, &to) in offsets.iter().enumerate() {
        let at = index_at + INDEX_ENTRY_LEN * i;
        let from = u64::from_le_bytes(region[at..at + 8].try_into().unwrap()) as usize;
        extents.push((to, &src[from..from + extent as usize]));
        region[at..at + 8].copy_from_slice(&to.to_le_bytes());
    }
    let crc = crc32fast::hash(&region[..region_len - 4]);
    region[region_len - 4..].copy_from_slice(&crc.to_le_bytes());
    let file = File::create(out).unwrap();
    file.set_len(offsets.iter().max().unwrap() + extent).unwrap();
    write_at(&file, &region, 0);
    for (to, bytes) in extents {
        write_at(&file, bytes, to);
    }
}

fn write_at(file: &File, bytes: &[u8], offset: u64) {
    use std::os::unix::fs::FileExt;
    file.write_all_at(bytes, offset).unwrap();
}

#[cfg(unix)]
#[test]
fn a_store_with_extents_past_4_gib_reads_back_exactly() {
    let dir = TempDir::new("past-4gib");
    let near = write_small_store(&dir.path().join("near.bin"));
    let extent = near.extent_len() as u64;
    assert!(extent > 4096, "an extent must be able to straddle 4 GiB");
    // Below 4 GiB, straddling it, just above, past 8 GiB, past 12 GiB off a MiB boundary, and at
    // 20 GiB (about where the full-size store ends): offsets past every 32-bit width.
    let offsets = [
        near.data_offset(),
        GIB4 - 4096,
        GIB4 - 4096 + extent,
        2 * GIB4 + 4096,
        3 * GIB4 + (1 << 20) + 4096 * 7,
        5 * GIB4,
    ];
    let far_path = dir.path().join("far.bin");
    relocate(&near, &offsets, &far_path);
    let meta = std::fs::metadata(&far_path).unwrap();
    use std::os::unix::fs::MetadataExt;
    println!("sparse store: {} bytes long, {} bytes on disk", meta.len(), meta.blocks() * 512);
    assert!(meta.len() > 5 * GIB4);

    let buffered = ExpertStore::open(&far_path, HASH).unwrap();
    let direct =
        ExpertStore::open_with(&far_path, HASH, OpenOptions { direct_io: true, ..Default::default() }).unwrap();
    match direct.io_mode() {
        IoMode::Direct => println!("uncached (O_DIRECT) reads checked too"),
        IoMode::Buffered => println!("O_DIRECT refused here ({:?}): buffered reads only", direct.direct_io_error()),
    }
    let mut i = 0;
    for layer in [0, 39] {
        for e in 0..3 {
            let mut want = near.alloc_buffer();
            near.read_expert(layer, e, &mut want).unwrap();
            assert_eq!(buffered.entry(layer, e).unwrap().offset, offsets[i]);
            for store in [&buffered, &direct] {
                let mut got = store.alloc_buffer();
                store.read_expert(layer, e, &mut got).unwrap();
                assert!(got[..] == want[..], "layer {layer} expert {e} at {} differs", offsets[i]);
                assert_eq!(store.decode_expert(&got).unwrap(), near.decode_expert(&want).unwrap());
            }
            i += 1;
        }
    }
    // A store cut short of its last extent (past 4 GiB) is refused at open, as any other.
    File::options().write(true).open(&far_path).unwrap().set_len(5 * GIB4 + extent - 1).unwrap();
    assert!(ExpertStore::open(&far_path, HASH).is_err());
}

/// `k` distinct experts, each from `hot` with probability `skew`, else uniform.
fn pick_k(rng: &mut Rng, hot: &[u32], skew: f32) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::with_capacity(TOP_K);
    while out.len() < TOP_K {
        let e = if rng.unit() < skew { hot[rng.below(hot.len())] } else { rng.below(EXPERTS) as u32 };
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// 12 requests of three topics (each a hot set of 24 experts per layer), each a 32-token prompt
/// and 24 decode steps: 300 steps over all 40 layers.
fn full_size_trace() -> Trace {
    let mut rng = Rng::new(47);
    let hot: Vec<Vec<Vec<u32>>> =
        (0..3).map(|_| (0..LAYERS).map(|_| (0..24).map(|_| rng.below(EXPERTS) as u32).collect()).collect()).collect();
    let expert_bytes = ExpertLayout::new(int4(), HIDDEN, EXPERT_WIDTH).unwrap().extent_len as u64;
    let header = TraceHeader::new(LAYERS, EXPERTS, TOP_K, (0..LAYERS as u32).collect(), expert_bytes);
    let mut events = Vec::new();
    for r in 0..12 {
        events.push(TraceEvent::Request(r));
        for s in 0..25 {
            let (phase, tokens) = if s == 0 { (Phase::Prefill, 32) } else { (Phase::Decode, 1) };
            let layers = (0..LAYERS)
                .map(|l| {
                    let ids = (0..tokens).flat_map(|_| pick_k(&mut rng, &hot[r as usize % 3][l], 0.8)).collect();
                    (l as u32, ids)
                })
                .collect();
            events.push(TraceEvent::Step(TraceStep { phase, tokens, layers }));
        }
    }
    Trace { header, events }
}

/// Replays `trace` as the simulator does, checking after every layer that the model's slots are
/// what its waves and prefetches said and that the layer's experts are resident, and after every
/// step's last layer that no slot holds two experts and no expert sits in two slots; returns
/// (hits, misses, prefetch loads).
fn replay_checked(trace: &Trace, policy: PolicyKind, prefetch: PrefetchKind) -> (u64, u64, u64) {
    let config = SimConfig { slots: SLOTS, policy, prefetch, eamc_capacity: DEFAULT_EAMC_CAPACITY };
    let mut mirror: Vec<Option<ExpertId>> = vec![None; SLOTS];
    let s = replay_observed(trace, config, |r| {
        for wave in r.waves {
            assert!(wave.resident.len() <= SLOTS);
            for &(id, slot) in &wave.evictions {
                assert_eq!(mirror[slot as usize].take(), Some(id));
            }
            for &(id, slot) in &wave.loads {
                assert_eq!(mirror[slot as usize].replace(id), None, "load into an occupied slot");
            }
            for &(e, slot) in &wave.resident {
                assert_eq!(r.cache.slot_of(ExpertId::new(r.layer, e as usize)), Some(slot));
            }
        }
        for &(id, slot) in r.prefetched {
            mirror[slot as usize] = Some(id);
        }
        if r.layer + 1 < LAYERS {
            return;
        }
        let mut seen = HashSet::new();
        let mut resident = 0;
        for (id, slot) in r.cache.resident() {
            assert!(seen.insert(id), "{id:?} in two slots");
            assert_eq!(mirror[slot as usize], Some(id));
            assert_eq!(r.cache.slot_of(id), Some(slot));
            resident += 1;
        }
        assert_eq!(resident, mirror.iter().flatten().count());
        assert!(resident <= SLOTS);
    })
    .unwrap();
    (s.hits, s.misses, s.prefetch_issued)
}

#[test]
fn ten_thousand_experts_at_25_percent_slots() {
    let trace = full_size_trace();
    assert_eq!(trace.header.total_experts(), 10_240);
    // The header passes the limits a trace file is read with.
    let dir = TempDir::new("full-trace");
    let path = dir.path().join("trace.jsonl");
    trace.write(&path).unwrap();
    assert_eq!(Trace::read(&path).unwrap(), trace);
    let accesses = access_sequence(&trace).len() as u64;
    for prefetch in [PrefetchKind::None, PrefetchKind::Eamc] {
        let policies = match prefetch {
            PrefetchKind::None => vec![PolicyKind::Lru, PolicyKind::Eamc],
            _ => vec![PolicyKind::Eamc],
        };
        let started = Instant::now();
        let sim = simulate(&trace, &[SLOTS], &policies, prefetch, DEFAULT_EAMC_CAPACITY).unwrap();
        let sim_s = started.elapsed().as_secs_f64();
        for (policy, r) in policies.iter().zip(&sim) {
            let started = Instant::now();
            let (hits, misses, prefetched) = replay_checked(&trace, *policy, prefetch);
            println!(
                "{policy:?}+{prefetch:?}: hit rate {:.3}, {} prefetched; {} steps replayed in {:.2} s with checks (simulator {sim_s:.2} s)",
                r.hit_rate,
                r.prefetch_issued,
                trace.events.len() - trace.requests(),
                started.elapsed().as_secs_f64()
            );
            assert_eq!(hits + misses, accesses, "{policy:?}");
            assert_eq!((r.hits, r.misses, r.prefetch_issued), (hits, misses, prefetched), "{policy:?}+{prefetch:?}");
            assert!(r.hits > 0 && r.misses >= SLOTS as u64 / 4);
        }
    }
}

/// Routes one request of `steps` decode steps (after a 4-token prompt) through `t`, `hot`
/// experts preferred.
fn track_request(t: &mut EamTracker, rng: &mut Rng, hot: &[u32], steps: usize) {
    t.begin_request();
    for s in 0..=steps {
        let (phase, tokens) = if s == 0 { (Phase::Prefill, 4) } else { (Phase::Decode, 1) };
        t.begin_step(phase);
        for l in 0..LAYERS {
            let mut counts = vec![0u32; EXPERTS];
            for _ in 0..tokens {
                pick_k(rng, hot, 0.7).into_iter().for_each(|e| counts[e as usize] += 1);
            }
            t.record_layer(l, counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(e, &c)| (e, c)));
        }
    }
    t.end_request();
}

#[test]
fn a_full_eam_collection_at_40_by_256_stays_bounded() {
    let mut rng = Rng::new(4747);
    let hot: Vec<Vec<u32>> = (0..8).map(|_| (0..32).map(|_| rng.below(EXPERTS) as u32).collect()).collect();
    let mut t = EamTracker::new(LAYERS, EXPERTS, DEFAULT_EAMC_CAPACITY, DEFAULT_MATCHES);
    let started = Instant::now();
    for r in 0..DEFAULT_EAMC_CAPACITY + 20 {
        track_request(&mut t, &mut rng, &hot[r % hot.len()], 2);
    }
    let fill_s = started.elapsed().as_secs_f64();
    let c = t.collection();
    assert_eq!(c.len(), DEFAULT_EAMC_CAPACITY, "a full collection replaces, it does not grow");
    let entry = c.get(0).unwrap();
    assert_eq!((entry.decode.layers(), entry.decode.experts()), (LAYERS, EXPERTS));
    // Two f32 matrices (prefill, decode) of L × E per entry.
    let matrix_bytes = DEFAULT_EAMC_CAPACITY * 2 * LAYERS * EXPERTS * 4;
    println!(
        "collection: {} entries of 2 × {LAYERS} × {EXPERTS}, {:.1} MiB of counts; {} requests tracked in {fill_s:.2} s",
        c.len(),
        matrix_bytes as f64 / 1048576.0,
        DEFAULT_EAMC_CAPACITY + 20
    );

    // A decode step's bookkeeping against the full collection: 40 layers' routing counted and
    // matched, and a prediction of the next layers after each.
    t.begin_request();
    let (steps, lookahead) = (20, 3);
    let started = Instant::now();
    for _ in 0..steps {
        t.begin_step(Phase::Decode);
        for l in 0..LAYERS {
            t.record_layer(l, pick_k(&mut rng, &hot[1], 0.7).into_iter().map(|e| (e as usize, 1)));
            assert!(t.best_matches().len() <= DEFAULT_MATCHES);
            assert!(t.prediction().matched() <= DEFAULT_MATCHES);
            let predicted = t.predict(l, lookahead);
            assert!(predicted.len() <= lookahead * EXPERTS);
            assert!(predicted.iter().all(|(id, _)| (id.layer as usize) > l && (id.layer as usize) <= l + lookahead));
        }
    }
    let per_step = started.elapsed().as_secs_f64() / steps as f64;
    println!("one decode step's EAM bookkeeping (40 layers, top-8, lookahead {lookahead}): {:.2} ms", per_step * 1e3);
    assert!(!t.best_matches().is_empty(), "a request like the past ones finds matches");
    t.end_request();
    assert_eq!(t.collection().len(), DEFAULT_EAMC_CAPACITY);

    // The collection saves (flat cell indices up to 10,240) and loads back at full size.
    let dir = TempDir::new("full-eamc");
    let path = dir.path().join("eamc.json");
    t.save(&path).unwrap();
    let loaded = EamCollection::load(&path, DEFAULT_EAMC_CAPACITY, LAYERS, EXPERTS).unwrap();
    assert_eq!(loaded.len(), DEFAULT_EAMC_CAPACITY);
    for i in [0, 150, DEFAULT_EAMC_CAPACITY - 1] {
        assert_eq!(loaded.get(i), t.collection().get(i));
    }
    println!("saved collection: {} bytes", std::fs::metadata(&path).unwrap().len());
}

/// A full-size `qwen35moe` GGUF loads its matrices in their own ggml types: the DeltaNet
/// in-projection gathered from `attn_qkv`, `attn_gate`, `ssm_beta` and `ssm_alpha`, the gated
/// attention's query and gate split from `attn_q`, and `ssm_out` (columns moved in whole value
/// heads) keep their blocks, and the embedding and lm_head are uploaded without an f32 copy.
/// Before, the first three went to the GPU in f32 (4.7 GB at full size, 7x their Q4_0 bytes)
/// and the last two were dequantized on the host (2 GB each at vocab 248,320), so a 3 GiB bound
/// could not hold the model. The fixture (BF16, 4 value heads on 2 key heads) at CI size.
#[test]
fn gguf_hybrid_matrices_keep_their_blocks() {
    use moestream::model::gguf::{arch, GgufModel};
    use moestream::model::{hybrid_weights, layer_weights, Checkpoint};

    let path = common::fixtures_dir().join("gguf/qwen3_5_moe-bf16.gguf");
    let model = GgufModel::open(&path).unwrap();
    let spec = arch::spec_from_gguf(&model).unwrap();
    let ck = Checkpoint::from_gguf(model, &spec).unwrap();
    let hy = spec.hybrid.as_ref().expect("a hybrid model");
    let bf16 = |v: &[u8]| -> Vec<f32> {
        v.chunks_exact(2).map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)).collect()
    };
    let w = hybrid_weights::linear_attention(&ck, &spec, hy, 0).unwrap();
    for (name, t) in [("in_proj", &w.in_proj), ("out_proj", &w.out)] {
        let g = t.ggml.as_ref().unwrap_or_else(|| panic!("{name} lost its GGUF blocks"));
        assert_eq!(bf16(&g.bytes), t.data, "{name}: the blocks are the values, in Hugging Face order");
    }
    let layer = layer_weights::layer(&ck, &spec, 1).unwrap();
    let layer_weights::AttentionBlock::Grouped(a) = &layer.attn else { panic!("layer 1 is gated full attention") };
    for (name, t) in [("query", &a.q), ("gate", a.gate.as_ref().expect("an output gate"))] {
        let g = t.ggml.as_ref().unwrap_or_else(|| panic!("{name} lost its GGUF blocks"));
        assert_eq!(bf16(&g.bytes), t.data, "{name}");
    }
    let (embed, _, head) = layer_weights::globals_to_upload(&ck, &spec).unwrap();
    let (embed_f32, _, head_f32) = layer_weights::globals(&ck, &spec).unwrap();
    for (upload, full) in [(&embed, &embed_f32), (&head, &head_f32)] {
        assert!(upload.data.is_empty(), "no f32 copy on the host");
        assert_eq!(upload.ggml, full.ggml);
        assert_eq!(bf16(&upload.ggml.as_ref().unwrap().bytes), full.data);
    }
}
