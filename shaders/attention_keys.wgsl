// Causal grouped-query attention for CPU adapters (lavapipe: a workgroup's 8 invocations are
// the SIMD lanes of one thread): the same slots, dispatch and output as attention.wgsl's
// ONE_TEAM layout, with the keys rather than a head's dims shared out among the lanes.
//
// On lavapipe a load whose address differs per lane and a cross-lane shuffle each cost a loop
// over the lanes, and loads are unavoidable while shuffles are not. attention.wgsl splits a
// head's dims over its lanes, so each block of 8 keys needs a butterfly of shuffles to form the
// scores and another to share the softmax weights. Here lane l takes keys j0 + l + 8b of each
// block of KPL * 8 keys and computes their scores for QT query slots whole (every lane holds the
// whole pre-scaled query of each slot), then runs its own online softmax and accumulates whole
// value rows: the key loop has no cross-lane step. The 8 lanes' states (max, sum, accumulator)
// are merged once at the end: the largest max by a butterfly, then the accumulators by a
// reduce-scatter (swap half, add) that leaves lane l the dims' chunks l, l + 8, ... it writes.
// Cross-lane steps are subgroup shuffles (SUBGROUPS without SHARED_REDUCE) or workgroup memory.
//#include common
//#include attention_io

const LANES: u32 = 8u;
// Keys per lane between two rescalings of its accumulator.
const KPL: u32 = 4u;
// 8-dim chunks of a head: head_dim <= 64, 128 (HD128) or 256 (HD256).
//#if HD256
const HC: u32 = 32u;
//#else
//#if HD128
const HC: u32 = 16u;
//#else
const HC: u32 = 8u;
//#endif
//#endif

var<workgroup> xch: array<vec4<f32>, LANES>;

// `v` of lane `lane ^ o`. Every invocation must call it.
fn lane_xor(lane: u32, v: vec4<f32>, o: u32) -> vec4<f32> {
//#if SUBGROUPS
//#if SHARED_REDUCE
    return lane_xor_shared(lane, v, o);
//#else
    return subgroupShuffleXor(v, o);
//#endif
//#else
    return lane_xor_shared(lane, v, o);
//#endif
}

fn lane_xor_shared(lane: u32, v: vec4<f32>, o: u32) -> vec4<f32> {
    workgroupBarrier();
    xch[lane] = v;
    workgroupBarrier();
    return xch[lane ^ o];
}

// One step of the reduce-scatter of chunk pairs (a, b): lanes with bit `o` clear keep a, the
// others b, each adding its partner's copy of what it keeps.
fn halve(lane: u32, a: Chunk, b: Chunk, o: u32) -> Chunk {
    let hi = (lane & o) != 0u;
    let keep_lo = select(a.lo, b.lo, hi);
    let keep_hi = select(a.hi, b.hi, hi);
    let got_lo = lane_xor(lane, select(b.lo, a.lo, hi), o);
    let got_hi = lane_xor(lane, select(b.hi, a.hi, hi), o);
    return Chunk(keep_lo + got_lo, keep_hi + got_hi);
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let g = group_index(wid, nwg);
    // Slot sets: hs query heads of one KV head (`sets` of them per KV head), one per workgroup.
    let hs = min(p.group, QT);
    let sets = (p.group + hs - 1u) / hs;
    let n_sets = p.chunk_heads * sets;
    let block = g / n_sets;
    if (past_last_token(block, hs)) {
        return;
    }
    let slots = slots_of(block, g % n_sets, n_sets, sets, hs);
    let cpr = p.head_dim / 8u;
    // Each slot's whole query, pre-scaled; zero past head_dim (chunks past it re-read the last).
    var qr: array<array<Chunk, HC>, QT>;
    for (var s = 0u; s < QT; s++) {
        for (var c = 0u; c < HC; c++) {
            qr[s][c] = q_chunk(slots.rows[s], min(c, cpr - 1u), select(0.0, p.scale, slots.valid[s] && c < cpr));
        }
    }
    var m: Slots;
    var l: Slots;
    var acc: array<array<Chunk, HC>, QT>;
    for (var s = 0u; s < QT; s++) {
        m[s] = -1.0e30;
        l[s] = 0.0;
        for (var c = 0u; c < HC; c++) {
            acc[s][c] = Chunk(vec4<f32>(0.0), vec4<f32>(0.0));
        }
    }
    let row0 = slots.kv_local * p.context;
    let end = slots.end;
    for (var j0 = slots.first; j0 < end; j0 += LANES * KPL) {
        // This lane's keys j0 + lane + 8b; keys past `end` re-read the last one (weight 0).
        var sc: array<Slots, KPL>;
        var bmax: Slots;
        for (var s = 0u; s < QT; s++) {
            bmax[s] = -1.0e30;
        }
        for (var b = 0u; b < KPL; b++) {
            let j = j0 + LANES * b + lane;
            let kr = row0 + cache_row(min(j, end - 1u));
            var dot_s: Slots;
            for (var s = 0u; s < QT; s++) {
                dot_s[s] = 0.0;
            }
            for (var c = 0u; c < HC; c++) {
                let kc = k_chunk(kr, min(c, cpr - 1u));
                let ks = k_scale(kr, min(c, cpr - 1u));
                for (var s = 0u; s < QT; s++) {
                    dot_s[s] += (dot(qr[s][c].lo, kc.lo) + dot(qr[s][c].hi, kc.hi)) * ks;
                }
            }
            for (var s = 0u; s < QT; s++) {
                sc[b][s] = select(-1.0e30, dot_s[s], j >= slots.starts[s] && j < slots.ends[s]);
                bmax[s] = max(bmax[s], sc[b][s]);
            }
        }
        for (var s = 0u; s < QT; s++) {
            let m_new = max(m[s], bmax[s]);
            let corr = exp(m[s] - m_new);
            m[s] = m_new;
            l[s] *= corr;
            for (var c = 0u; c < HC; c++) {
                acc[s][c] = Chunk(acc[s][c].lo * corr, acc[s][c].hi * corr);
            }
        }
        for (var b = 0u; b < KPL; b++) {
            let vr = row0 + cache_row(min(j0 + LANES * b + lane, end - 1u));
            var w: Slots;
            for (var s = 0u; s < QT; s++) {
                w[s] = select(0.0, exp(sc[b][s] - m[s]), sc[b][s] > -1.0e30);
                l[s] += w[s];
            }
            for (var c = 0u; c < HC; c++) {
                let vc = v_chunk(vr, min(c, cpr - 1u));
                let vs = v_scale(vr, min(c, cpr - 1u));
                for (var s = 0u; s < QT; s++) {
                    let ws = w[s] * vs;
                    acc[s][c] = Chunk(acc[s][c].lo + ws * vc.lo, acc[s][c].hi + ws * vc.hi);
                }
            }
        }
    }
    // Merge the lanes: every lane rescales to the largest max, then sums are reduced.
    var ml = vec4<f32>(-1.0e30);
    for (var s = 0u; s < QT; s++) {
        ml[s] = m[s];
    }
    for (var o = 1u; o < LANES; o <<= 1u) {
        ml = max(ml, lane_xor(lane, ml, o));
    }
    var ll = vec4<f32>(0.0);
    for (var s = 0u; s < QT; s++) {
        let f = exp(m[s] - ml[s]);
        ll[s] = l[s] * f;
        for (var c = 0u; c < HC; c++) {
            acc[s][c] = Chunk(acc[s][c].lo * f, acc[s][c].hi * f);
        }
    }
    for (var o = 1u; o < LANES; o <<= 1u) {
        ll += lane_xor(lane, ll, o);
    }
    for (var s = 0u; s < QT; s++) {
        // Chunks g * 8 + r, reduce-scattered over the lanes per group g: lane r keeps chunk r.
        var mine: array<Chunk, HC / LANES>;
        for (var gi = 0u; gi < HC / LANES; gi++) {
            let c0 = gi * LANES;
            var w4: array<Chunk, 4>;
            for (var k = 0u; k < 4u; k++) {
                w4[k] = halve(lane, acc[s][c0 + k], acc[s][c0 + k + 4u], 4u);
            }
            var w2: array<Chunk, 2>;
            for (var k = 0u; k < 2u; k++) {
                w2[k] = halve(lane, w4[k], w4[k + 2u], 2u);
            }
            mine[gi] = halve(lane, w2[0], w2[1], 1u);
        }
        if (slots.valid[s]) {
            let o = slot_out(slots, s, block, lane, ml[s], ll[s]);
            for (var gi = 0u; gi < HC / LANES; gi++) {
                let c = gi * LANES + lane;
                if (c < cpr) {
                    store_chunk(o, c, mine[gi]);
                }
            }
        }
    }
}
