// Causal grouped-query attention over one chunk of the KV cache (a run of KV heads, laid out as
// kv_store writes them: head-major, F16 = two halves per u32), for the query heads that read it.
// Query t sits at position step.pos + t and sees keys 0 ..= step.pos + t, or with a sliding
// window (window > 0) only its last `window` keys step.pos + t + 1 - window ..= step.pos + t
// (transformers' sliding_window_overlay: kv > q - window). Keys are visited in blocks of 8 with
// an online softmax, so any length works and no score matrix is ever stored.
//
// A team of 8 lanes runs QT = 4 queries ("slots": query heads of one KV head, times tokens)
// against that KV head, so every key and value load serves 4 queries. Lanes split a head's
// dims: lane l owns the 8-dim chunks l, l + 8, ... (CH of them: head_dim <= 64, 128 (HD128)
// or 256 (HD256); head_dim a multiple of 8), so each load is 16 contiguous bytes and the team
// reads a key row side by side (lavapipe pays per load instruction, GPUs per transaction). Per
// block of 8 keys each lane sums its dims' share of the (key, slot) dot products; a butterfly
// over the team (reduce-scatter: swap half, add) leaves lane l the scores of key l; the softmax
// weights then go to every lane for the value loop, where each lane accumulates its own dims.
// Cross-lane steps are subgroup shuffles (SUBGROUPS without SHARED_REDUCE) or go through
// workgroup memory. QT = 4 rather than 8: twice the state per lane ran twice as slow on lavapipe.
// The split pass of a model with fewer than 4 query heads per KV head has fewer slots to fill
// (one token): QT2 / QT1 size the team to the group instead of computing empty slots.
//
// Layouts: ONE_TEAM (CPU adapters such as lavapipe, where a workgroup is one thread and its
// lanes SIMD lanes): a workgroup is one team. Otherwise (GPUs) 8 teams per workgroup, taking
// 8 slot sets of the same tokens (and split), so every team walks the same keys and the
// workgroup stays in uniform control flow.
//
// Slot sets, bindings and the output: attention_io.wgsl.
//#include common
//#include attention_io

// Lanes of a team and keys of a block (one per lane after the reduction).
const TEAM: u32 = 8u;
//#if ONE_TEAM
const TEAMS: u32 = 1u;
//#else
const TEAMS: u32 = 8u;
//#endif
const WG: u32 = TEAM * TEAMS;
//#if HD256
const CH: u32 = 4u;
//#else
//#if HD128
const CH: u32 = 2u;
//#else
const CH: u32 = 1u;
//#endif
//#endif

var<workgroup> xch: array<f32, WG * QT>;
// Subgroup index of this team's lane 0.
var<private> team_base: u32;

// `v` of lane (this lane ^ o) of the team. Every invocation must call it.
fn lane_xor(lid: u32, v_in: Slots, o: u32) -> Slots {
    var v = v_in;
    var r: Slots;
//#if SUBGROUPS
//#if SHARED_REDUCE
    r = lane_xor_shared(lid, v, o);
//#else
    for (var s = 0u; s < QT; s++) {
        r[s] = subgroupShuffleXor(v[s], o);
    }
//#endif
//#else
    r = lane_xor_shared(lid, v, o);
//#endif
    return r;
}

fn lane_xor_shared(lid: u32, v_in: Slots, o: u32) -> Slots {
    var v = v_in;
    var r: Slots;
    workgroupBarrier();
    for (var s = 0u; s < QT; s++) {
        xch[lid * QT + s] = v[s];
    }
    workgroupBarrier();
    for (var s = 0u; s < QT; s++) {
        r[s] = xch[(lid ^ o) * QT + s];
    }
    return r;
}

// `v` of every lane of the team. Every invocation must call it.
fn team_all(lid: u32, v_in: Slots) -> array<Slots, TEAM> {
    var v = v_in;
    var r: array<Slots, TEAM>;
//#if SUBGROUPS
//#if SHARED_REDUCE
    r = team_all_shared(lid, v);
//#else
    for (var k = 0u; k < TEAM; k++) {
        for (var s = 0u; s < QT; s++) {
            r[k][s] = subgroupShuffle(v[s], team_base + k);
        }
    }
//#endif
//#else
    r = team_all_shared(lid, v);
//#endif
    return r;
}

fn team_all_shared(lid: u32, v_in: Slots) -> array<Slots, TEAM> {
    var v = v_in;
    var r: array<Slots, TEAM>;
    workgroupBarrier();
    for (var s = 0u; s < QT; s++) {
        xch[lid * QT + s] = v[s];
    }
    workgroupBarrier();
    let first = lid - lid % TEAM;
    for (var k = 0u; k < TEAM; k++) {
        for (var s = 0u; s < QT; s++) {
            r[k][s] = xch[(first + k) * QT + s];
        }
    }
    return r;
}

// One step of the reduce-scatter: of the pair (a, b), the lanes with bit `o` clear keep a and
// the others b, each adding the partner's copy of what it keeps.
fn halve(lid: u32, a_in: Slots, b_in: Slots, o: u32) -> Slots {
    var a = a_in;
    var b = b_in;
    let hi = (lid & o) != 0u;
    var keep: Slots;
    var send: Slots;
    for (var s = 0u; s < QT; s++) {
        keep[s] = select(a[s], b[s], hi);
        send[s] = select(b[s], a[s], hi);
    }
    var got = lane_xor(lid, send, o);
    for (var s = 0u; s < QT; s++) {
        keep[s] += got[s];
    }
    return keep;
}

// part[k]: this lane's share of key k's scores. Returns lane l's full scores of key l.
fn scatter_keys(lid: u32, part_in: array<Slots, TEAM>) -> Slots {
    var part = part_in;
    var w4: array<Slots, 4>;
    for (var k = 0u; k < 4u; k++) {
        w4[k] = halve(lid, part[k], part[k + 4u], 4u);
    }
    var w2: array<Slots, 2>;
    for (var k = 0u; k < 2u; k++) {
        w2[k] = halve(lid, w4[k], w4[k + 2u], 2u);
    }
    return halve(lid, w2[0], w2[1], 1u);
}

fn team_max(lid: u32, v: Slots) -> Slots {
    var r = v;
    for (var o = 1u; o < TEAM; o <<= 1u) {
        var other = lane_xor(lid, r, o);
        for (var s = 0u; s < QT; s++) {
            r[s] = max(r[s], other[s]);
        }
    }
    return r;
}

fn team_sum(lid: u32, v: Slots) -> Slots {
    var r = v;
    for (var o = 1u; o < TEAM; o <<= 1u) {
        var other = lane_xor(lid, r, o);
        for (var s = 0u; s < QT; s++) {
            r[s] += other[s];
        }
    }
    return r;
}

@compute @workgroup_size(WG)
//#if SUBGROUPS
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_invocation_id) sid: u32) {
    team_base = sid - sid % TEAM;
//#else
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
//#endif
    let g = group_index(wid, nwg);
    let lane = lid % TEAM;
    // Slot sets: hs query heads of one KV head (`sets` of them per KV head).
    let hs = min(p.group, QT);
    let sets = (p.group + hs - 1u) / hs;
    let n_sets = p.chunk_heads * sets;
    let wg_per_block = (n_sets + TEAMS - 1u) / TEAMS;
    let block = g / wg_per_block;
    if (past_last_token(block, hs)) {
        return;
    }
    let slots = slots_of(block, (g % wg_per_block) * TEAMS + lid / TEAM, n_sets, sets, hs);
    let first = slots.first;
    let end = slots.end;
    let cpr = p.head_dim / 8u;
    // This lane's chunks of each slot's query, pre-scaled; zero past head_dim.
    var qr: array<array<Chunk, CH>, QT>;
    for (var s = 0u; s < QT; s++) {
        for (var i = 0u; i < CH; i++) {
            let c = lane + TEAM * i;
            qr[s][i] = q_chunk(slots.rows[s], min(c, cpr - 1u), select(0.0, p.scale, slots.valid[s] && c < cpr));
        }
    }
    var m: Slots;
    var l: Slots;
    var acc: array<array<Chunk, CH>, QT>;
    for (var s = 0u; s < QT; s++) {
        m[s] = -1.0e30;
        l[s] = 0.0;
        for (var i = 0u; i < CH; i++) {
            acc[s][i] = Chunk(vec4<f32>(0.0), vec4<f32>(0.0));
        }
    }
    let row0 = slots.kv_local * p.context;
    for (var j0 = first; j0 < end; j0 += TEAM) {
        // Keys past `end` re-read the last one (their weight is 0).
        var row_of: array<u32, TEAM>;
        for (var k = 0u; k < TEAM; k++) {
            row_of[k] = row0 + cache_row(min(j0 + k, end - 1u));
        }
        var part: array<Slots, TEAM>;
        for (var k = 0u; k < TEAM; k++) {
            for (var s = 0u; s < QT; s++) {
                part[k][s] = 0.0;
            }
            for (var i = 0u; i < CH; i++) {
                let c = min(lane + TEAM * i, cpr - 1u);
                let kc = k_chunk(row_of[k], c);
                let ks = k_scale(row_of[k], c);
                for (var s = 0u; s < QT; s++) {
                    part[k][s] += (dot(qr[s][i].lo, kc.lo) + dot(qr[s][i].hi, kc.hi)) * ks;
                }
            }
        }
        // Lane l: the scores of key j0 + l.
        var score = scatter_keys(lid, part);
        let j = j0 + lane;
        var sc: Slots;
        for (var s = 0u; s < QT; s++) {
            sc[s] = select(-1.0e30, score[s], j >= slots.starts[s] && j < slots.ends[s]);
        }
        var bmax = team_max(lid, sc);
        var pj: Slots;
        var corr: Slots;
        for (var s = 0u; s < QT; s++) {
            let m_new = max(m[s], bmax[s]);
            pj[s] = select(0.0, exp(sc[s] - m_new), sc[s] > -1.0e30);
            corr[s] = exp(m[s] - m_new);
            m[s] = m_new;
            // Each lane keeps the sum of its own keys' weights; one reduction at the end.
            l[s] = l[s] * corr[s] + pj[s];
            for (var i = 0u; i < CH; i++) {
                acc[s][i] = Chunk(acc[s][i].lo * corr[s], acc[s][i].hi * corr[s]);
            }
        }
        var weights = team_all(lid, pj);
        for (var k = 0u; k < TEAM; k++) {
            for (var i = 0u; i < CH; i++) {
                let c = min(lane + TEAM * i, cpr - 1u);
                let vc = v_chunk(row_of[k], c);
                let vs = v_scale(row_of[k], c);
                for (var s = 0u; s < QT; s++) {
                    let w = weights[k][s] * vs;
                    acc[s][i] = Chunk(acc[s][i].lo + w * vc.lo, acc[s][i].hi + w * vc.hi);
                }
            }
        }
    }
    l = team_sum(lid, l);
    for (var s = 0u; s < QT; s++) {
        if (!slots.valid[s]) {
            continue;
        }
        let o = slot_out(slots, s, block, lane, m[s], l[s]);
        for (var i = 0u; i < CH; i++) {
            let c = lane + TEAM * i;
            if (c < cpr) {
                store_chunk(o, c, acc[s][i]);
            }
        }
    }
}
