//! Trace format, replay simulator, Belady bound, statistics and plots.

mod common;

use common::Rng;
use moestream::experts::policy::{Phase, PolicyKind};
use moestream::experts::predictor::PrefetchKind;
use moestream::experts::trace::{Trace, TraceError, TraceEvent, TraceHeader, TraceReader, TraceStep, TraceWriter};
use moestream::sim::{
    access_sequence, heatmap_svg, parse_capacities, per_request_hit_rates, plot_svg, results_json, results_table,
    shift_recovery, simulate, trace_stats, vs_belady, workload_shift, SimConfig, SimResult,
};

const EXPERT_BYTES: u64 = 1 << 20;

fn header(layers: usize, experts: usize, top_k: usize) -> TraceHeader {
    TraceHeader::new(layers, experts, top_k, (0..layers as u32).collect(), EXPERT_BYTES)
}

/// One request, one decode token per step, top-1, one layer: a classic paging sequence.
fn paging_trace(seq: &[u32]) -> Trace {
    let mut events = vec![TraceEvent::Request(0)];
    events.extend(
        seq.iter()
            .map(|&e| TraceEvent::Step(TraceStep { phase: Phase::Decode, tokens: 1, layers: vec![(0, vec![e])] })),
    );
    Trace { header: header(1, 8, 1), events }
}

/// `k` distinct experts drawn by `pick`.
fn distinct(k: usize, experts: usize, mut pick: impl FnMut() -> usize) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::with_capacity(k);
    let mut tries = 0;
    while out.len() < k {
        let e = if tries < 64 { pick() } else { tries % experts } as u32;
        tries += 1;
        if !out.contains(&e) {
            out.push(e);
        }
    }
    out
}

/// Requests in "task groups": each group prefers its own hot set of 2k experts per layer
/// (chosen with probability `skew`), the rest uniform. `groups` lists each request's group.
fn grouped_trace(seed: u64, groups: &[usize], skew: f64, prompt: usize, decode: usize) -> Trace {
    let (layers, experts, k) = (4, 16, 2);
    let mut rng = Rng::new(seed);
    let hot: Vec<Vec<Vec<usize>>> = (0..=*groups.iter().max().unwrap())
        .map(|_| {
            (0..layers)
                .map(|_| distinct(2 * k, experts, || rng.below(experts)).iter().map(|&e| e as usize).collect())
                .collect()
        })
        .collect();
    let mut events = Vec::new();
    for (r, &g) in groups.iter().enumerate() {
        events.push(TraceEvent::Request(r as u64));
        for s in 0..=decode {
            let (phase, tokens) = if s == 0 { (Phase::Prefill, prompt) } else { (Phase::Decode, 1) };
            let layers = (0..layers)
                .map(|l| {
                    let ids = (0..tokens)
                        .flat_map(|_| {
                            distinct(k, experts, || {
                                if f64::from(rng.unit()) < skew {
                                    hot[g][l][rng.below(2 * k)]
                                } else {
                                    rng.below(experts)
                                }
                            })
                        })
                        .collect();
                    (l as u32, ids)
                })
                .collect();
            events.push(TraceEvent::Step(TraceStep { phase, tokens, layers }));
        }
    }
    Trace { header: header(layers, experts, k), events }
}

fn result<'a>(rs: &'a [SimResult], policy: &str, slots: usize) -> &'a SimResult {
    rs.iter().find(|r| r.policy == policy && r.slots == slots).unwrap()
}

#[test]
fn belady_matches_textbook_optimum() {
    // Silberschatz's reference string, 3 frames: OPT 9 faults, LRU 12.
    let t = paging_trace(&[7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]);
    let rs = simulate(&t, &[3], &[PolicyKind::Belady, PolicyKind::Lru], PrefetchKind::None, 300).unwrap();
    assert_eq!(result(&rs, "belady", 3).misses, 9);
    assert_eq!(result(&rs, "belady", 3).hits, 11);
    assert_eq!(result(&rs, "lru", 3).misses, 12);
    // 1 2 3 4 1 2 5 1 2 3 4 5 with 3 frames: OPT 7 faults, LRU 10; with 4 frames OPT 6, LRU 8.
    let t = paging_trace(&[1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5]);
    let rs = simulate(&t, &[3, 4], &[PolicyKind::Belady, PolicyKind::Lru], PrefetchKind::None, 300).unwrap();
    assert_eq!(result(&rs, "belady", 3).misses, 7);
    assert_eq!(result(&rs, "lru", 3).misses, 10);
    assert_eq!(result(&rs, "belady", 4).misses, 6);
    // Traces carry no prerouter predictions: asking for them is an error, not a silent no-op.
    assert!(simulate(&t, &[3], &[PolicyKind::Lru], PrefetchKind::Prerouter, 300).is_err());
    assert_eq!(result(&rs, "lru", 4).misses, 8);
    assert_eq!(result(&rs, "belady", 4).bytes_read, 6 * EXPERT_BYTES);
}

#[test]
fn belady_bounds_every_policy() {
    let mut traces = Vec::new();
    for seed in 1..4 {
        traces.push(grouped_trace(seed, &[0, 1, 2, 0, 1, 2, 0, 1], 0.0, 5, 12));
        traces.push(grouped_trace(seed + 10, &[0, 0, 1, 1, 2, 0, 1, 2], 0.9, 7, 20));
    }
    let mut seq = Vec::new();
    let mut rng = Rng::new(99);
    for _ in 0..200 {
        seq.push(if rng.unit() < 0.7 { rng.below(3) } else { rng.below(8) } as u32);
    }
    traces.push(paging_trace(&seq));
    let online = [PolicyKind::Lru, PolicyKind::Lfu, PolicyKind::Eamc];
    for t in &traces {
        let slots = [1, 2, 3, 5, 8, 16, 32];
        let rs = simulate(t, &slots, &PolicyKind::ALL, PrefetchKind::None, 300).unwrap();
        for &s in &slots {
            let best = result(&rs, "belady", s);
            for p in online {
                let r = result(&rs, p.name(), s);
                assert!(best.hits >= r.hits, "belady {} < {} {} at {s} slots", best.hits, p, r.hits);
                assert_eq!(best.hits + best.misses, r.hits + r.misses);
            }
        }
    }
}

#[test]
fn prefetch_accounting_and_policy_comparison() {
    let groups: Vec<usize> = (0..40).map(|r| r % 4).collect();
    let t = grouped_trace(5, &groups, 0.9, 8, 24);
    let slots = parse_capacities("25%,50%", t.header.total_experts(), t.header.top_k).unwrap();
    assert_eq!(slots, vec![16, 32]);
    let mut rs = simulate(&t, &slots, &PolicyKind::ALL, PrefetchKind::None, 300).unwrap();
    rs.extend(simulate(&t, &slots, &[PolicyKind::Lru, PolicyKind::Eamc], PrefetchKind::Eamc, 300).unwrap());
    println!("{}", results_table(&rs));
    for r in &rs {
        assert_eq!(r.prefetch_issued, r.prefetch_used + r.prefetch_wasted);
        assert_eq!(r.bytes_read, (r.misses + r.prefetch_issued) * EXPERT_BYTES);
        if r.prefetch == "none" {
            assert_eq!(r.prefetch_issued, 0);
        } else {
            assert!(r.prefetch_used > 0);
        }
    }
    // The structure is per request, not global: EAMC beats LFU's global counts.
    for &s in &slots {
        let eamc = rs.iter().find(|r| r.policy == "eamc" && r.prefetch == "none" && r.slots == s).unwrap();
        assert!(eamc.hit_rate > result(&rs, "lfu", s).hit_rate - 0.02);
    }
    let json: serde_json::Value = serde_json::from_str(&results_json(&rs)).unwrap();
    assert_eq!(json["results"].as_array().unwrap().len(), rs.len());
    assert_eq!(json["results"][0]["policy"], "lru");
    // Each result's share of Belady's hit rate at its own slot count, in the JSON too.
    for (i, r) in rs.iter().enumerate() {
        let ratio = vs_belady(&rs, r).unwrap();
        assert!((ratio - r.hit_rate / result(&rs, "belady", r.slots).hit_rate).abs() < 1e-12);
        // (A prefetcher may beat demand-only Belady; without one nothing can.)
        let bound = if r.policy == "belady" { ratio == 1.0 } else { r.prefetch != "none" || ratio < 1.0 };
        assert!(bound, "{} at {}: {ratio}", r.policy, r.slots);
        assert_eq!(json["results"][i]["vs_belady"].as_f64(), Some(ratio));
    }
    assert!(results_table(&rs).contains("÷ belady"));
    let svg = plot_svg(&rs);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("<polyline").count(), PolicyKind::ALL.len() + 2);
    let belady_at = svg.find(">belady<").unwrap();
    assert!(svg.rfind("<polyline").unwrap() < belady_at, "belady is drawn last");
}

#[test]
fn workload_shift_recovery() {
    let r = shift_recovery(&[0.2, 0.3, 0.5, 0.7, 0.8, 0.8, 0.8, 0.8], 0.05, 1);
    assert!((r.steady_state - 0.8).abs() < 1e-12);
    assert_eq!(r.requests, Some(4));
    assert_eq!(shift_recovery(&[0.2, 0.9, 0.9, 0.9], 0.05, 3).requests, Some(1));
    // Task A (groups 0, 1) then task B (groups 2, 3).
    let groups: Vec<usize> = (0..30).map(|r| r % 2).chain((0..30).map(|r| 2 + r % 2)).collect();
    let t = grouped_trace(8, &groups, 0.95, 6, 16);
    let config = SimConfig { slots: 16, policy: PolicyKind::Eamc, prefetch: PrefetchKind::None, eamc_capacity: 300 };
    let rates = per_request_hit_rates(&t, config).unwrap();
    assert_eq!(rates.len(), 60);
    let rec = workload_shift(&t, 30, config, 3).unwrap();
    println!("EAMC after the shift: {rec:?}");
    assert!(rec.requests.is_some());
    assert!(workload_shift(&t, 61, config, 3).is_err());
}

#[test]
fn trace_round_trip() {
    let mut t = grouped_trace(3, &[0, 1, 0], 0.8, 4, 3);
    // A prerouter prediction between two steps.
    t.events.insert(3, TraceEvent::Predicted(vec![(1, vec![2, 0])]));
    let bytes = t.write_to(Vec::new()).unwrap();
    let back = Trace::from_reader(TraceReader::new(&bytes[..]).unwrap()).unwrap();
    assert_eq!(back, t);
    // Streaming writer to a file, borrowed steps, then read back.
    let path = std::env::temp_dir().join(format!("moestream-{}-trace.jsonl", std::process::id()));
    let mut w = TraceWriter::create(&path, &t.header).unwrap();
    for e in &t.events {
        match e {
            TraceEvent::Request(n) => w.request(*n).unwrap(),
            TraceEvent::Step(s) => w.step(s.phase, s.tokens, &s.layers).unwrap(),
            TraceEvent::Predicted(_) => w.event(e).unwrap(),
        }
    }
    w.finish().unwrap();
    assert_eq!(Trace::read(&path).unwrap(), t);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("{\"format\":\"moestream-trace\",\"version\":1,\"layers\":4"));
    assert!(text.contains("{\"request\":1}"));
    assert!(text.contains("{\"step\":{\"phase\":\"decode\",\"tokens\":1,\"layers\":[[0,["));
    assert!(text.contains("{\"predicted\":[[1,[2,0]]]}"));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(Trace::read(&path), Err(TraceError::Open { .. })));
}

fn line_of_error(text: &str) -> usize {
    let err = TraceReader::new(text.as_bytes()).and_then(Trace::from_reader).unwrap_err();
    assert!(err.to_string().contains("line"), "{err}");
    match err {
        TraceError::Line { line, .. } => line,
        other => panic!("expected a line error, got {other}"),
    }
}

#[test]
fn malformed_trace_names_the_line() {
    let h = serde_json::to_string(&header(2, 4, 2)).unwrap();
    let good = "{\"step\":{\"phase\":\"decode\",\"tokens\":1,\"layers\":[[0,[1,2]],[1,[0,3]]]}}";
    let ok = format!("{h}\n{{\"request\":0}}\n{good}\n\n{good}\n");
    assert_eq!(Trace::from_reader(TraceReader::new(ok.as_bytes()).unwrap()).unwrap().events.len(), 3);
    assert_eq!(line_of_error(&format!("{h}\n{{\"request\":0}}\n{good}\n{{\"step\": oops\n")), 4);
    // Wrong id count, out-of-range expert, unknown layer, unknown phase (after a blank line).
    let bad_len = good.replace("[1,2]", "[1]");
    assert_eq!(line_of_error(&format!("{h}\n{bad_len}\n")), 2);
    let bad_id = good.replace("[0,3]", "[0,4]");
    assert_eq!(line_of_error(&format!("{h}\n{good}\n{bad_id}\n")), 3);
    let bad_layer = good.replace("[1,[0,3]]", "[2,[0,3]]");
    assert_eq!(line_of_error(&format!("{h}\n{bad_layer}\n")), 2);
    let bad_phase = good.replace("decode", "verify");
    assert_eq!(line_of_error(&format!("{h}\n\n{bad_phase}\n")), 3);
    // Predictions: at most top_k ids of MoE layers, below the expert count.
    let predicted = "{\"predicted\":[[1,[3,0]]]}";
    let ok = format!("{h}\n{good}\n{predicted}\n{good}\n");
    assert_eq!(Trace::from_reader(TraceReader::new(ok.as_bytes()).unwrap()).unwrap().events.len(), 3);
    for bad in
        [predicted.replace("[3,0]", "[3,0,1]"), predicted.replace("[3,0]", "[4]"), predicted.replace("[1,", "[2,")]
    {
        assert_eq!(line_of_error(&format!("{h}\n{good}\n{bad}\n")), 3, "{bad}");
    }
    // Header problems are line 1.
    assert_eq!(line_of_error(""), 1);
    assert_eq!(line_of_error("{\"format\":\"x\"}\n"), 1);
    let v2 = h.replace("\"version\":1", "\"version\":2");
    assert_eq!(line_of_error(&format!("{v2}\n")), 1);
}

#[test]
fn capacity_specs() {
    assert_eq!(parse_capacities("10%,25%,64", 128, 8).unwrap(), vec![13, 32, 64]);
    assert_eq!(parse_capacities(" 1% , 3", 128, 8).unwrap(), vec![8, 3]);
    assert_eq!(parse_capacities("100%", 128, 8).unwrap(), vec![128]);
    for bad in ["", "abc", "0", "0%", "150%", "10%%", "-3", "5,"] {
        assert!(parse_capacities(bad, 128, 8).is_err(), "{bad:?} should fail");
    }
}

#[test]
fn trace_statistics() {
    let groups: Vec<usize> = (0..12).map(|r| r % 4).collect();
    let t = grouped_trace(11, &groups, 0.95, 6, 20);
    let s = trace_stats(&t);
    println!("{}", s.summary());
    assert_eq!(s.requests, 12);
    assert_eq!(s.steps, 12 * 21);
    assert_eq!((s.prefill_tokens, s.decode_tokens), (12 * 6, 12 * 20));
    assert_eq!(s.decode.requests, 12);
    // Skewed within a request, flatter when pooled.
    assert!(s.decode.mean_request_coverage < s.decode.pooled_coverage);
    assert!(s.decode.mean_request_gini > s.decode.pooled_gini);
    assert!(s.decode.min_working_set <= s.decode.max_working_set);
    let h = &s.reuse_distance;
    let n: u64 = h.counts.iter().sum::<u64>() + h.cold;
    assert_eq!(n as usize, access_sequence(&t).len());
    assert!(h.cold <= 4 * 16);
    assert_eq!(h.upper_bounds.len(), h.counts.len());
    let json: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
    assert_eq!(json["decode"]["requests"], 12);
    let svg = heatmap_svg(&s);
    assert_eq!(svg.matches("<rect").count(), 4 * 16 + 2);
    // Stack distances: a b a → distance 1; a a → 0.
    let p = trace_stats(&paging_trace(&[0, 1, 0, 0]));
    assert_eq!(p.reuse_distance.cold, 2);
    assert_eq!(p.reuse_distance.counts, vec![1, 1]);
}
