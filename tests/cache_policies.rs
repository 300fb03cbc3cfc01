//! Cache policies, EAM machinery and the pure-logic cache model.

mod common;

use common::Rng;
use std::collections::BTreeSet;
use std::path::PathBuf;

use moestream::experts::cache_model::{CacheModel, Wave};
use moestream::experts::eam::{Eam, EamCollection, EamError, EamTracker, RequestEam, QUERY_DECAY};
use moestream::experts::policy::{
    eamc, ArcPolicy, CachePolicy, EamcPolicy, ExpertId, Lfu, Lru, Phase, PolicyContext, PolicyKind, S3Fifo,
};
use moestream::experts::predictor::{EamcPredictor, PredictedRouting, PrefetchKind, PrerouterPredictor};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("moestream-{}-{name}", std::process::id()))
}

fn demand(capacity: usize, layers: usize, experts: usize, policy: Box<dyn CachePolicy>) -> CacheModel {
    CacheModel::new(capacity, layers, experts, policy, None, EamTracker::new(layers, experts, 0, 3))
}

/// Feeds single-expert decode steps on layer 0; returns the hits.
fn hits_of(cache: &mut CacheModel, seq: &[u32]) -> u64 {
    cache.begin_request();
    for &e in seq {
        cache.begin_step(Phase::Decode, 1);
        cache.route(0, &[e]);
    }
    cache.end_request();
    cache.stats().hits
}

#[test]
fn lru_known_hits() {
    // A B C A D A B with 3 slots: A hits twice; D evicts B, B evicts C.
    let mut c = demand(3, 1, 8, Box::new(Lru::default()));
    assert_eq!(hits_of(&mut c, &[0, 1, 2, 0, 3, 0, 1]), 2);
    let resident: BTreeSet<u32> = c.resident().map(|(id, _)| id.expert).collect();
    assert_eq!(resident, BTreeSet::from([0, 1, 3]));
    // 0 0 1 2 0 1 with 2 slots: LRU evicts 0 for 2, then thrashes.
    let mut c = demand(2, 1, 8, Box::new(Lru::default()));
    assert_eq!(hits_of(&mut c, &[0, 0, 1, 2, 0, 1]), 1);
}

#[test]
fn lfu_known_hits_and_lru_ties() {
    // 0 0 1 2 0 1 with 2 slots: 0 is used twice, so 2 evicts 1 and 1 evicts 2.
    let mut c = demand(2, 1, 8, Box::new(Lfu::default()));
    assert_eq!(hits_of(&mut c, &[0, 0, 1, 2, 0, 1]), 2);
    // Equal counts fall back to LRU: 0 1 2 evicts 0, so 1 hits and 0 misses.
    let mut c = demand(2, 1, 8, Box::new(Lfu::default()));
    assert_eq!(hits_of(&mut c, &[0, 1, 2, 1]), 1);
    let mut c = demand(2, 1, 8, Box::new(Lfu::default()));
    assert_eq!(hits_of(&mut c, &[0, 1, 2, 0]), 0);
    // Counts are global: 1 used 3 times, evicted, reloaded — it still outweighs 2 and 3.
    let mut c = demand(2, 1, 8, Box::new(Lfu::default()));
    // 1 1 1 | 2 3 (3 evicts 2) | 0 (evicts 3, count 1 vs 1's 3) | 1 hit
    assert_eq!(hits_of(&mut c, &[1, 1, 1, 2, 3, 0, 1]), 3);
}

#[test]
fn policy_kinds_parse_and_build() {
    for k in PolicyKind::ALL {
        assert_eq!(k.name().parse::<PolicyKind>().unwrap(), k);
    }
    assert!("mru".parse::<PolicyKind>().is_err());
    assert!(PolicyKind::Belady.build(4).is_err());
    for k in [PolicyKind::Lru, PolicyKind::Lfu, PolicyKind::Eamc, PolicyKind::S3fifo, PolicyKind::Arc] {
        assert_eq!(PolicyKind::build(k, 4).unwrap().name(), k.name());
    }
    assert_eq!("EAMC".parse::<PrefetchKind>().unwrap(), PrefetchKind::Eamc);
    assert!(PrefetchKind::None.build().is_none());
}

#[test]
fn s3fifo_scan_does_not_flush_main() {
    // 10 slots: S aims at 1, G holds 9. Load 0..10, use 0..9 again, then scan 20 new experts
    // once each: the first scan load moves 0..9 (used again) to M and evicts 9 from S; every
    // later scan load evicts the previous scan expert from S. So 0..9 all hit again after it.
    let seq: Vec<u32> = (0..10).chain(0..9).chain(10..30).chain(0..9).collect();
    assert_eq!(hits_of(&mut demand(10, 1, 32, Box::new(S3Fifo::new(10))), &seq), 18);
    // LRU loses the whole hot set to the scan.
    assert_eq!(hits_of(&mut demand(10, 1, 32, Box::new(Lru::default())), &seq), 9);
}

#[test]
fn s3fifo_ghost_hit_enters_main() {
    // Load 0..10; 10 evicts 0 (unused since loaded) from S, its id enters G; 0 comes back and
    // enters M (evicting 1 from S); a scan of 20 then churns S only, so 0 still hits.
    let seq: Vec<u32> = (0..11).chain([0]).chain(11..31).chain([0]).collect();
    assert_eq!(hits_of(&mut demand(10, 1, 32, Box::new(S3Fifo::new(10))), &seq), 1);
    assert_eq!(hits_of(&mut demand(10, 1, 32, Box::new(Lru::default())), &seq), 0);
}

/// Drives `policy` as a cache of `capacity` slots on one layer: per access, a hit or a load
/// (evicting the policy's victim among all residents when full); returns the hits.
fn drive(policy: &mut dyn CachePolicy, capacity: usize, seq: &[u32]) -> u64 {
    let t = EamTracker::new(1, 32, 0, 3);
    let mut resident: Vec<ExpertId> = Vec::new();
    let mut hits = 0;
    for (clock, &e) in seq.iter().enumerate() {
        let ctx = PolicyContext { layer: 0, clock: clock as u64, phase: Phase::Decode, eam: &t };
        let id = ExpertId::new(0, e as usize);
        if resident.contains(&id) {
            hits += 1;
        } else {
            if resident.len() == capacity {
                let victim = resident.remove(policy.victims(&resident, 1, &ctx)[0]);
                policy.on_remove(victim, &ctx);
            }
            policy.on_insert(id, &ctx);
            resident.push(id);
        }
        policy.on_access(id, &ctx);
    }
    hits
}

#[test]
fn arc_adapts_its_target() {
    // 2 slots. 0 1 0: 0 moves to T2. 2 evicts 1 (T1 holds 1 > p = 0) into B1; 1 evicts 2 into
    // B1 and, found in B1 (|B1| = 2, |B2| = 0), raises p by 1.
    let mut arc = ArcPolicy::new(2);
    assert_eq!(drive(&mut arc, 2, &[0, 1, 0, 2, 1]), 1);
    assert_eq!(arc.target(), 1.0);
    // 2: T1 is empty, so T2's LRU 0 goes to B2; 2 is found in B1 (|B1| = |B2| = 1): p = 2.
    let mut arc = ArcPolicy::new(2);
    drive(&mut arc, 2, &[0, 1, 0, 2, 1, 2]);
    assert_eq!(arc.target(), 2.0);
    // 0: T2's LRU 1 goes to B2; 0 is found in B2 (|B1| = 0, |B2| = 2): p = 1.
    let mut arc = ArcPolicy::new(2);
    drive(&mut arc, 2, &[0, 1, 0, 2, 1, 2, 0]);
    assert_eq!(arc.target(), 1.0);
}

#[test]
fn arc_keeps_reused_experts_through_a_scan() {
    // 3 slots: 0 and 1 are used twice (T2); the scan 2..9 only cycles T1 (p stays 0).
    let seq = [0, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1];
    assert_eq!(hits_of(&mut demand(3, 1, 32, Box::new(ArcPolicy::new(3))), &seq), 4);
    assert_eq!(hits_of(&mut demand(3, 1, 32, Box::new(Lru::default())), &seq), 2);
}

#[test]
fn queue_policies_pass_over_experts_not_offered() {
    let t = EamTracker::new(1, 32, 0, 3);
    let ctx = PolicyContext { layer: 0, clock: 0, phase: Phase::Decode, eam: &t };
    let ids: Vec<ExpertId> = (0..3).map(|e| ExpertId::new(0, e)).collect();
    let policies: [Box<dyn CachePolicy>; 2] = [Box::new(S3Fifo::new(10)), Box::new(ArcPolicy::new(10))];
    for mut p in policies {
        for &id in &ids {
            p.on_insert(id, &ctx);
            p.on_access(id, &ctx);
        }
        // Oldest first: 0, but when 0 is not offered, 1.
        assert_eq!(p.victims(&ids, 3, &ctx), vec![0, 1, 2], "{}", p.name());
        assert_eq!(p.victims(&ids[1..], 1, &ctx), vec![0], "{}", p.name());
        assert_eq!(p.victim(&[ids[2], ids[0]], &ctx), 1, "{}", p.name());
    }
}

fn eam(layers: usize, experts: usize, cells: &[(usize, usize, f32)]) -> Eam {
    let mut m = Eam::new(layers, experts);
    for &(l, e, n) in cells {
        m.add(l, e, n);
    }
    m
}

fn request(cells: &[(usize, usize, f32)]) -> RequestEam {
    let mut r = RequestEam::new(4, 4);
    for &(l, e, n) in cells {
        r.add(Phase::Decode, l, e, n);
    }
    r
}

#[test]
fn cosine_matching() {
    let a = eam(2, 3, &[(0, 0, 2.0), (1, 2, 1.0)]);
    let b = eam(2, 3, &[(0, 0, 4.0), (1, 2, 2.0)]);
    let c = eam(2, 3, &[(0, 1, 1.0)]);
    assert!((a.cosine(&b) - 1.0).abs() < 1e-9);
    assert_eq!(a.cosine(&c), 0.0);
    assert_eq!(a.cosine(&Eam::new(2, 3)), 0.0);
    let d = eam(2, 3, &[(0, 0, 1.0), (0, 1, 1.0)]);
    assert!((a.cosine(&d) - 2.0 / (5f64.sqrt() * 2f64.sqrt())).abs() < 1e-9);

    // Collection matching: best first, only positive similarities.
    let mut col = EamCollection::new(10, 4, 4);
    col.insert(request(&[(0, 0, 5.0)]));
    col.insert(request(&[(0, 1, 5.0)]));
    col.insert(request(&[(0, 0, 1.0), (0, 1, 3.0)]));
    let m = col.best_matches(&request(&[(0, 1, 1.0)]), 3);
    assert_eq!(m.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 2]);
    assert!(m[0].1 > m[1].1);

    // Prefill and decode halves are unit-normalised, so a huge prompt does not drown decode.
    let mut q = RequestEam::new(4, 4);
    q.add(Phase::Prefill, 0, 0, 1000.0);
    q.add(Phase::Decode, 1, 1, 1.0);
    let mut same_decode = RequestEam::new(4, 4);
    same_decode.add(Phase::Prefill, 0, 2, 1.0);
    same_decode.add(Phase::Decode, 1, 1, 1.0);
    assert!((q.similarity(&same_decode) - 0.5).abs() < 1e-9);
}

#[test]
fn full_collection_replaces_most_similar() {
    let mut col = EamCollection::new(3, 4, 4);
    let a = request(&[(0, 0, 5.0)]);
    let b = request(&[(1, 1, 5.0)]);
    let c = request(&[(2, 2, 5.0)]);
    for r in [&a, &b, &c] {
        assert_eq!(col.insert(r.clone()), None);
    }
    let near_b = request(&[(1, 1, 4.0), (2, 3, 1.0)]);
    assert_eq!(col.insert(near_b.clone()), Some(1));
    assert_eq!(col.len(), 3);
    assert_eq!(col.get(0), Some(&a));
    assert_eq!(col.get(1), Some(&near_b));
    assert_eq!(col.get(2), Some(&c));
    // Empty EAMs and zero capacity keep nothing.
    assert_eq!(col.insert(RequestEam::new(4, 4)), None);
    assert_eq!(col.len(), 3);
    let mut none = EamCollection::new(0, 4, 4);
    none.insert(a);
    assert!(none.is_empty());
}

/// A tracker (L = 4, E = 4) whose collection holds one decode request using expert 0 at layer 0,
/// expert 3 at layers 1 and 2, and expert 0 at layer 2.
fn trained_tracker() -> EamTracker {
    let mut t = EamTracker::new(4, 4, 8, 1);
    t.begin_request();
    t.begin_step(Phase::Decode);
    t.record(0, 0, 10);
    t.record(1, 3, 10);
    t.record(2, 3, 5);
    t.record(2, 0, 5);
    t.end_request();
    // A dissimilar request that must not be matched.
    t.begin_request();
    t.begin_step(Phase::Decode);
    t.record(0, 2, 10);
    t.record(1, 1, 10);
    t.end_request();
    t.begin_request();
    t.begin_step(Phase::Decode);
    t.record(0, 0, 1);
    t
}

#[test]
fn predictions_decay_with_layer_distance() {
    let t = trained_tracker();
    assert_eq!(t.best_matches().len(), 1);
    assert_eq!(t.best_matches()[0].0, 0);
    let p = t.predict(0, 2);
    // Layer 1: p = 1 · (1 − 1/4); layer 2: p = 0.5 · (1 − 2/4).
    assert_eq!(p, vec![(ExpertId::new(1, 3), 0.75), (ExpertId::new(2, 0), 0.25), (ExpertId::new(2, 3), 0.25),]);
    // Only the next layer with a lookahead of one; later layers only.
    assert_eq!(t.predict(0, 1), vec![(ExpertId::new(1, 3), 0.75)]);
    assert!(t.predict(2, 2).is_empty());
    let mut pred = EamcPredictor::new(2);
    let ctx = PolicyContext { layer: 0, clock: 0, phase: Phase::Decode, eam: &t };
    use moestream::experts::predictor::Predictor;
    assert_eq!(pred.predict(0, &ctx)[0], ExpertId::new(1, 3));
}

#[test]
fn incremental_matching_equals_full_matching() {
    // The query is the request's EAM with each earlier step's counts × QUERY_DECAY per step since.
    let mut rng = Rng::new(7);
    let mut t = EamTracker::new(3, 5, 6, 2);
    for _ in 0..9 {
        t.begin_request();
        let mut query = RequestEam::new(3, 5);
        for step in 0..4 {
            let phase = if step == 0 { Phase::Prefill } else { Phase::Decode };
            t.begin_step(phase);
            query.prefill.scale(QUERY_DECAY as f32);
            query.decode.scale(QUERY_DECAY as f32);
            for l in 0..3 {
                let (e, n) = (rng.below(5), 1 + rng.below(3) as u32);
                t.record(l, e, n);
                query.add(phase, l, e, n as f32);
            }
        }
        let full = t.collection().best_matches(&query, 2);
        let inc = t.best_matches().to_vec();
        assert_eq!(full.len(), inc.len());
        for (a, b) in full.iter().zip(&inc) {
            assert_eq!(a.0, b.0);
            assert!((a.1 - b.1).abs() < 1e-6);
        }
        t.end_request();
    }
    assert_eq!(t.collection().len(), 6);
}

#[test]
fn eviction_priority_order() {
    let t = trained_tracker();
    let pred = t.prediction();
    assert_eq!(pred.matched(), 1);
    // Probability over (1 + 2·d/4), d = layers routed before the expert's layer comes again.
    let ids = [
        ExpertId::new(0, 0), // p ≈ 1: routing layer 0, d = 3 → 0.4; routing layer 2, d = 1 → 0.67
        ExpertId::new(0, 1), // p ≈ ε → ε · 0.4; ε · 0.67
        ExpertId::new(2, 0), // p ≈ 0.5: d = 1 → 0.33; d = 3 → 0.2
        ExpertId::new(2, 1), // p ≈ ε → ε · 0.67; ε · 0.4
        ExpertId::new(1, 3), // p ≈ 1: d = 0 → 1; d = 2 → 0.5
    ];
    let order = |current| {
        let mut by_priority = ids.to_vec();
        let p = |id| eamc::priority(&pred, id, current, 4);
        by_priority.sort_by(|a, b| p(*a).total_cmp(&p(*b)));
        by_priority
    };
    assert_eq!(order(0), vec![ids[1], ids[3], ids[2], ids[0], ids[4]], "lowest priority first");
    assert_eq!(order(2), vec![ids[3], ids[1], ids[2], ids[4], ids[0]], "the next layers are kept");
    // The prefetcher's swap test keeps the paper's fixed factor 1 − l/4, whatever is routed:
    // 1 · 1, ε · 1, 0.5 · 0.5, ε · 0.5, 1 · 0.75.
    let mut by_prefetch = ids.to_vec();
    by_prefetch.sort_by(|a, b| eamc::prefetch_priority(&pred, *a, 4).total_cmp(&eamc::prefetch_priority(&pred, *b, 4)));
    assert_eq!(by_prefetch, vec![ids[3], ids[1], ids[2], ids[4], ids[0]]);
    // The policy evicts the lowest priority; among equal priorities, the least recently used.
    let mut policy = EamcPolicy::default();
    let ctx = |clock| PolicyContext { layer: 0, clock, phase: Phase::Decode, eam: &t };
    assert_eq!(policy.victim(&ids, &ctx(0)), 1);
    let twins = [ExpertId::new(3, 1), ExpertId::new(3, 2)];
    policy.on_access(twins[1], &ctx(1));
    policy.on_access(twins[0], &ctx(2));
    assert_eq!(policy.victim(&twins, &ctx(3)), 1);
}

#[test]
fn empty_collection_falls_back_to_current_request() {
    let mut t = EamTracker::new(4, 4, 8, 3);
    t.begin_request();
    t.begin_step(Phase::Decode);
    t.record(2, 1, 3);
    t.record(2, 2, 1);
    let p = t.prediction();
    assert_eq!(p.matched(), 0);
    assert_eq!(p.probability(2, 1), 0.75);
    assert_eq!(t.predict(0, 2), vec![(ExpertId::new(2, 1), 0.375), (ExpertId::new(2, 2), 0.125)]);
}

#[test]
fn persistence_round_trip_and_dims_check() {
    let mut rng = Rng::new(3);
    let mut t = EamTracker::new(4, 6, 5, 2);
    for r in 0..8 {
        t.begin_request();
        t.begin_step(Phase::Prefill);
        for _ in 0..10 {
            t.record(rng.below(4), (r + rng.below(2)) % 6, 1);
        }
        t.begin_step(Phase::Decode);
        for _ in 0..6 {
            t.record(rng.below(4), (r * 2 + rng.below(3)) % 6, 1);
        }
        t.end_request();
    }
    let path = tmp("eamc.json");
    t.save(&path).unwrap();
    let mut u = EamTracker::new(4, 6, 5, 2);
    u.load(&path).unwrap();
    assert_eq!(u.collection().len(), t.collection().len());
    for tr in [&mut t, &mut u] {
        tr.begin_request();
        tr.begin_step(Phase::Decode);
        tr.record(0, 2, 1);
        tr.record(1, 3, 2);
    }
    assert_eq!(t.best_matches(), u.best_matches());
    for l in 0..4 {
        assert_eq!(t.predict(l, 2), u.predict(l, 2));
    }
    let mut wrong = EamTracker::new(4, 8, 5, 2);
    match wrong.load(&path) {
        Err(EamError::Dims { expected, found, .. }) => {
            assert_eq!(expected, (4, 8));
            assert_eq!(found, (4, 6));
        }
        other => panic!("expected a dims error, got {other:?}"),
    }
    std::fs::write(&path, "{\"format\":\"other\"}").unwrap();
    assert!(matches!(u.load(&path), Err(EamError::Format { .. })));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(u.load(&path), Err(EamError::Io { .. })));
}

/// Applies waves to a mirror of the slots, checking every wave is consistent.
fn apply(slots: &mut [Option<ExpertId>], layer: usize, waves: &[Wave], capacity: usize) {
    for w in waves {
        assert!(w.resident.len() <= capacity);
        for &(id, s) in &w.evictions {
            assert_eq!(slots[s as usize], Some(id));
            slots[s as usize] = None;
        }
        for &(id, s) in &w.loads {
            assert_eq!(slots[s as usize], None, "load into an occupied slot");
            slots[s as usize] = Some(id);
        }
        for &(e, s) in &w.resident {
            assert_eq!(slots[s as usize], Some(ExpertId::new(layer, e as usize)));
        }
    }
}

#[test]
fn waves_cover_every_expert_once() {
    let mut c = demand(3, 2, 8, Box::new(Lru::default()));
    let mut slots = vec![None; 3];
    c.begin_request();
    c.begin_step(Phase::Decode, 1);
    let w = c.route(0, &[5, 6]);
    apply(&mut slots, 0, &w, 3);
    // A prompt of 5 tokens, top-2, touching all 8 experts.
    c.begin_step(Phase::Prefill, 5);
    let routed = [0, 1, 2, 3, 4, 5, 6, 7, 5, 6];
    let waves = c.route(0, &routed);
    apply(&mut slots, 0, &waves, 3);
    assert_eq!(waves.len(), 3);
    let mut seen: Vec<u32> = waves.iter().flat_map(|w| w.resident.iter().map(|r| r.0)).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..8).collect::<Vec<_>>());
    // Hits (5, 6) come first and are not reloaded; every other expert is loaded once.
    assert_eq!(waves[0].resident[..2], [(5, w[0].resident[0].1), (6, w[0].resident[1].1)]);
    let loads: Vec<u32> = waves.iter().flat_map(|w| w.loads.iter().map(|l| l.0.expert)).collect();
    assert_eq!(loads.len(), 6);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.loads), (2, 8, 8));
    assert!(c.resident().count() <= 3);
}

fn eamc_cache(capacity: usize, max_prefetch: Option<usize>) -> CacheModel {
    CacheModel::new(
        capacity,
        4,
        8,
        PolicyKind::Eamc.build(capacity).unwrap(),
        PrefetchKind::Eamc.build(),
        EamTracker::new(4, 8, 16, 3),
    )
    .with_max_prefetch(max_prefetch)
}

/// One request where every layer routes experts {2l, 2l+1} for `steps` decode steps.
fn patterned_request(c: &mut CacheModel, steps: usize, slots: &mut [Option<ExpertId>]) {
    c.begin_request();
    for _ in 0..steps {
        c.begin_step(Phase::Decode, 1);
        for l in 0..4 {
            let routed = [2 * l as u32, 2 * l as u32 + 1];
            let w = c.route(l, &routed);
            apply(slots, l, &w, c.capacity());
            for (id, s) in c.prefetch(l) {
                assert!(id.layer as usize > l);
                slots[s as usize] = Some(id);
                for &e in &routed {
                    assert!(c.slot_of(ExpertId::new(l, e as usize)).is_some());
                }
            }
        }
    }
    c.end_request();
}

#[test]
fn prefetch_never_evicts_current_layer_experts() {
    // Two slots, two experts per layer: every slot is pinned, so nothing can be prefetched.
    let mut c = eamc_cache(2, Some(8));
    let mut slots = vec![None; 2];
    patterned_request(&mut c, 3, &mut slots);
    patterned_request(&mut c, 3, &mut slots);
    assert_eq!(c.stats().prefetch_issued, 0);
    // Four slots: next layers' pairs are prefetched and used, and prefetch only saves misses.
    let mut baseline = CacheModel::new(4, 4, 8, PolicyKind::Eamc.build(4).unwrap(), None, EamTracker::new(4, 8, 16, 3));
    let mut slots = vec![None; 4];
    patterned_request(&mut baseline, 3, &mut slots);
    patterned_request(&mut baseline, 3, &mut slots);
    let mut c = eamc_cache(4, None);
    let mut slots = vec![None; 4];
    patterned_request(&mut c, 3, &mut slots);
    patterned_request(&mut c, 3, &mut slots);
    let s = c.stats();
    assert!(s.prefetch_issued > 0);
    assert!(s.prefetch_used > 0);
    assert!(s.misses < baseline.stats().misses, "{s:?} vs {:?}", baseline.stats());
    assert_eq!(s.loads, s.misses + s.prefetch_issued);
    for (id, slot) in c.resident() {
        assert_eq!(slots[slot as usize], Some(id));
    }
}

#[test]
fn prefetch_respects_its_cap() {
    let mut c = eamc_cache(8, Some(1));
    let mut slots = vec![None; 8];
    patterned_request(&mut c, 2, &mut slots);
    c.begin_request();
    c.begin_step(Phase::Decode, 1);
    c.route(0, &[0, 1]);
    assert!(c.prefetch(0).len() <= 1);
}

/// A random workload through an EAMC cache with prefetch; returns every plan made.
/// Every wave, every prefetch and the final stats of a run.
type Run = (Vec<Vec<Wave>>, Vec<Vec<(ExpertId, u32)>>, String);

fn random_run(seed: u64) -> Run {
    let mut rng = Rng::new(seed);
    let mut c = eamc_cache(6, None);
    let mut slots = vec![None; 6];
    let (mut waves, mut prefetches) = (Vec::new(), Vec::new());
    for r in 0..6 {
        c.begin_request();
        let steps = 1 + rng.below(6);
        for s in 0..steps {
            let tokens = if s == 0 { 3 } else { 1 };
            c.begin_step(if s == 0 { Phase::Prefill } else { Phase::Decode }, tokens);
            for l in 0..4 {
                let routed: Vec<u32> = (0..tokens * 2).map(|_| ((r + rng.below(4)) % 8) as u32).collect();
                let w = c.route(l, &routed);
                apply(&mut slots, l, &w, 6);
                let p = c.prefetch(l);
                for &e in &routed {
                    assert!(c.slot_of(ExpertId::new(l, e as usize)).is_some());
                }
                for &(id, s) in &p {
                    slots[s as usize] = Some(id);
                }
                waves.push(w);
                prefetches.push(p);
            }
        }
        c.end_request();
    }
    (waves, prefetches, serde_json::to_string(&c.stats()).unwrap())
}

#[test]
fn cache_model_is_deterministic() {
    let a = random_run(42);
    let b = random_run(42);
    assert_eq!(a, b);
    assert_ne!(a.2, random_run(43).2);
}

#[test]
fn running_requests_keep_their_own_matrices_and_predict_together() {
    // Two past requests: A (expert 0, then expert 3) and B (expert 2, then expert 1).
    let mut t = EamTracker::new(4, 4, 8, 1);
    for (first, second) in [(0, 3), (2, 1)] {
        t.begin_request();
        t.begin_step(Phase::Decode);
        t.record(0, first, 10);
        t.record(1, second, 10);
        t.end_request();
    }
    // Two requests run together, one routed like A, the other like B: each matches its own
    // past request, and the prediction is the union of both.
    t.begin_request_of(1);
    t.begin_request_of(2);
    t.begin_step(Phase::Decode);
    t.record_layer_of(1, Phase::Decode, 0, [(0, 1)]);
    t.record_layer_of(2, Phase::Decode, 0, [(2, 1)]);
    assert_eq!(t.request(1).unwrap().decode.get(0, 0), 1.0);
    assert_eq!(t.request(1).unwrap().decode.get(0, 2), 0.0, "not the other request's rows");
    assert_eq!(t.prediction().matched(), 2);
    let next: Vec<ExpertId> = t.predict(0, 1).into_iter().map(|(id, _)| id).collect();
    assert_eq!(next, vec![ExpertId::new(1, 1), ExpertId::new(1, 3)]);
    // Rows not attributed to a request count in the step's matrix only.
    t.record(0, 3, 5);
    assert_eq!(t.iteration().get(0, 3), 5.0);
    assert_eq!((t.request(1).unwrap().decode.get(0, 3), t.request(2).unwrap().decode.get(0, 3)), (0.0, 0.0));
    // One ends: its matrix is filed; the other goes on, matched against the larger collection.
    t.end_request_of(1);
    assert_eq!(t.collection().len(), 3);
    assert!(t.request(1).is_none());
    let next: Vec<ExpertId> = t.predict(0, 1).into_iter().map(|(id, _)| id).collect();
    assert_eq!(next, vec![ExpertId::new(1, 1)]);
}

/// A prefetched expert is awaited until the step it was read for has run: a demand load of that
/// step evicts others first, even where the policy would pick it (LFU: it was never used); once
/// its step is over unused, it goes like any other.
#[test]
fn prefetched_experts_wait_for_their_step() {
    let predicted = PredictedRouting::default();
    let predictor = Box::new(PrerouterPredictor::new(predicted.clone()));
    let mut c = CacheModel::new(3, 2, 8, Box::new(Lfu::default()), Some(predictor), EamTracker::new(2, 8, 0, 3));
    let step = |c: &mut CacheModel, routing: [u32; 2]| {
        c.begin_step(Phase::Decode, 1);
        for (layer, e) in routing.into_iter().enumerate() {
            c.route(layer, &[e]);
        }
    };
    // Experts (0,0) and (1,0) are used four times each.
    for _ in 0..4 {
        step(&mut c, [0, 0]);
    }
    // The heads predict (1,5) for the next token; it is read into the free slot.
    predicted.set(1, vec![5]);
    assert_eq!(c.prefetch_next_token(), vec![(ExpertId::new(1, 5), 2)]);
    // The next token routes layer 0 to a new expert: LFU would evict the unused (1,5), but it is
    // awaited, so (0,0) goes (used as often as (1,0), and less recently); layer 1 finds (1,5).
    c.begin_step(Phase::Decode, 1);
    let waves = c.route(0, &[3]);
    assert_eq!(waves[0].evictions.iter().map(|e| e.0).collect::<Vec<_>>(), vec![ExpertId::new(0, 0)]);
    assert!(c.slot_of(ExpertId::new(1, 5)).is_some());
    c.route(1, &[5]);
    assert_eq!((c.stats().prefetch_issued, c.stats().prefetch_used), (1, 1));
    // A wrong guess: (1,6) is read for a token that routes elsewhere. That token's two misses
    // evict others although LFU ranks (1,6) lowest; after it, (1,6) goes first.
    predicted.set(1, vec![6]);
    assert_eq!(c.prefetch_next_token().len(), 1);
    step(&mut c, [3, 5]);
    assert!(c.slot_of(ExpertId::new(1, 6)).is_some());
    c.begin_step(Phase::Decode, 1);
    let waves = c.route(0, &[4]);
    assert_eq!(waves[0].evictions.iter().map(|e| e.0).collect::<Vec<_>>(), vec![ExpertId::new(1, 6)]);
}

/// An expert the next token's prediction names that is already resident is kept for that token
/// as a prefetched one is: LFU would evict the once-used (1,1), which the heads predicted.
#[test]
fn predicted_resident_experts_wait_for_their_step() {
    let predicted = PredictedRouting::default();
    let predictor = Box::new(PrerouterPredictor::new(predicted.clone()));
    let mut c = CacheModel::new(2, 2, 8, Box::new(Lfu::default()), Some(predictor), EamTracker::new(2, 8, 0, 3));
    for routing in [[Some(0), None], [Some(0), None], [Some(0), Some(1)]] {
        c.begin_step(Phase::Decode, 1);
        for (layer, e) in routing.into_iter().enumerate() {
            if let Some(e) = e {
                c.route(layer, &[e]);
            }
        }
    }
    predicted.set(1, vec![1]);
    assert!(c.prefetch_next_token().is_empty(), "(1,1) is resident already");
    c.begin_step(Phase::Decode, 1);
    let waves = c.route(0, &[2]);
    assert_eq!(waves[0].evictions.iter().map(|e| e.0).collect::<Vec<_>>(), vec![ExpertId::new(0, 0)]);
    c.route(1, &[1]);
    assert_eq!((c.stats().hits, c.stats().misses), (3, 3), "(0,0), (1,1), (0,2) loaded; (0,0) twice and (1,1) hit");
}

/// A verify step's expected experts (its tokens' remembered routing) are read before it for the
/// nearest layers that fit with room for the largest layer's share, evicting policy victims
/// without a predictor's say; those already resident are kept for that step too.
#[test]
fn expected_experts_are_read_before_their_step() {
    let id = ExpertId::new;
    let mut c = demand(6, 3, 8, Box::new(Lru::default()));
    c.begin_step(Phase::Decode, 2);
    for (layer, es) in [(0, [0, 5]), (1, [0, 5]), (2, [0, 0])] {
        c.route(layer, &es);
    }
    // Expected: layer 0 {0, 1}, layer 1 {2}, layer 2 {3, 4}. The largest share is 2, so 4 slots
    // hold expected experts: layers 0 and 1 (3), not layer 2 as well (5). (0,1) takes the free
    // slot, (1,2) that of the least recently used expert outside them, (0,5) ((0,0) is kept).
    let expected = [id(0, 0), id(0, 1), id(1, 2), id(2, 3), id(2, 4)];
    let loads: Vec<ExpertId> = c.prefetch_expected(&expected).into_iter().map(|(e, _)| e).collect();
    assert_eq!(loads, vec![id(0, 1), id(1, 2)]);
    assert!(c.slot_of(id(0, 5)).is_none() && c.slot_of(id(0, 0)).is_some());
    // The step: layer 1's (1,7) misses and evicts (1,0), the least recently used expert that is
    // not awaited; both reads ahead are used.
    c.begin_step(Phase::Decode, 2);
    c.route(0, &[0, 1]);
    let waves = c.route(1, &[2, 7]);
    assert_eq!(waves[0].evictions.iter().map(|e| e.0).collect::<Vec<_>>(), vec![id(1, 0)]);
    assert_eq!((c.stats().prefetch_issued, c.stats().prefetch_used), (2, 2));
    // Nothing expected, or one layer's share too large to leave room: nothing read.
    assert!(c.prefetch_expected(&[]).is_empty());
    let crowded: Vec<ExpertId> = (0..5).map(|e| id(2, e)).collect();
    assert!(c.prefetch_expected(&crowded).is_empty(), "one layer's share fills the slots");
}
