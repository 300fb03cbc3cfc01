//! The expert cache as pure logic: which expert sits in which slot, what to load, what to evict.
//!
//! No GPU and no I/O: the engine applies the returned [`Wave`]s and prefetch loads to the slot
//! arena and slot table, and the simulator replays traces through the very same model.
//!
//! Per step the engine calls [`CacheModel::begin_step`], then per MoE layer
//! [`CacheModel::route`] (apply its waves in order: load, map, run the expert kernel), then
//! optionally [`CacheModel::prefetch`] (applied after the layer's waves). Requests are bracketed
//! by [`CacheModel::begin_request`] / [`CacheModel::end_request`].

use std::collections::BTreeSet;

use serde::Serialize;

use crate::experts::eam::{EamTracker, RequestKey};
use crate::experts::policy::{CachePolicy, ExpertId, Phase, PolicyContext};
use crate::experts::predictor::Predictor;

const NO_SLOT: u32 = u32::MAX;

/// Counters of a cache's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Distinct (layer, expert) needs per step already resident.
    pub hits: u64,
    /// Distinct (layer, expert) needs per step that had to be loaded.
    pub misses: u64,
    /// Experts loaded by prefetch.
    pub prefetch_issued: u64,
    /// Prefetched experts later hit before being evicted.
    pub prefetch_used: u64,
    /// Experts loaded (misses and prefetches).
    pub loads: u64,
    /// Experts evicted.
    pub evictions: u64,
    /// Steps begun.
    pub steps: u64,
    /// Tokens of those steps.
    pub tokens: u64,
}

impl CacheStats {
    /// `hits / (hits + misses)`, 0 before any access.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }

    /// Prefetched experts evicted unused (or still unused).
    pub fn prefetch_wasted(&self) -> u64 {
        self.prefetch_issued - self.prefetch_used
    }
}

/// One pass of a layer's expert kernel: at most `capacity` experts mapped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wave {
    /// Experts to read into slots before this pass.
    pub loads: Vec<(ExpertId, u32)>,
    /// Experts leaving their slots for those loads (apply before the loads).
    pub evictions: Vec<(ExpertId, u32)>,
    /// Every expert of this pass and its slot (the layer's slot-table entries for the pass).
    pub resident: Vec<(u32, u32)>,
}

/// Slot bookkeeping plus a replacement policy and an optional prefetch predictor.
pub struct CacheModel {
    capacity: usize,
    experts: usize,
    slots: Vec<Option<ExpertId>>,
    slot_of: Vec<u32>,
    free: BTreeSet<u32>,
    policy: Box<dyn CachePolicy>,
    predictor: Option<Box<dyn Predictor>>,
    tracker: EamTracker,
    clock: u64,
    phase: Phase,
    tokens: usize,
    top_k: usize,
    max_prefetch: Option<usize>,
    /// Prefetched and not yet used, per dense index.
    prefetched: Vec<bool>,
    /// The step each expert is awaited in (a step count; 0: none), until its first use there:
    /// a prefetched one's, and a resident one the next token's prediction names.
    awaited_in: Vec<u64>,
    /// Steps that have finished (a step finishes when the next begins or the next token's
    /// experts are prefetched).
    finished_steps: u64,
    /// Scratch marks per dense index (experts that may not be evicted right now).
    pinned: Vec<bool>,
    /// Distinct experts of the last routed layer.
    last_needed: Vec<ExpertId>,
    /// Which requests the next step's rows belong to ([`CacheModel::attribute_next_step`]).
    next_rows: Vec<StepRows>,
    /// Which requests the current step's rows belong to (empty: not told).
    step_rows: Vec<StepRows>,
    /// Scratch: one request's routed tokens per expert of a layer.
    request_counts: Vec<u32>,
    stats: CacheStats,
}

/// A run of consecutive rows of a step that belong to one request, in that request's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRows {
    /// The request.
    pub request: RequestKey,
    /// Its rows.
    pub rows: usize,
    /// Prefill (a prompt chunk) or decode.
    pub phase: Phase,
}

impl CacheModel {
    /// A cache of `capacity` slots for a model of `layers` layers of `experts` experts.
    ///
    /// # Panics
    /// If `capacity` is 0 (callers validate user input first).
    pub fn new(
        capacity: usize,
        layers: usize,
        experts: usize,
        policy: Box<dyn CachePolicy>,
        predictor: Option<Box<dyn Predictor>>,
        tracker: EamTracker,
    ) -> CacheModel {
        assert!(capacity > 0, "an expert cache needs at least one slot");
        assert_eq!(
            (tracker.layers(), tracker.experts()),
            (layers, experts),
            "EAM tracker dimensions differ from the cache's"
        );
        CacheModel {
            capacity,
            experts,
            slots: vec![None; capacity],
            slot_of: vec![NO_SLOT; layers * experts],
            free: (0..capacity as u32).collect(),
            policy,
            predictor,
            tracker,
            clock: 0,
            phase: Phase::Prefill,
            tokens: 0,
            top_k: 0,
            max_prefetch: None,
            prefetched: vec![false; layers * experts],
            awaited_in: vec![0; layers * experts],
            finished_steps: 0,
            pinned: vec![false; layers * experts],
            last_needed: Vec::new(),
            next_rows: Vec::new(),
            step_rows: Vec::new(),
            request_counts: vec![0; experts],
            stats: CacheStats::default(),
        }
    }

    /// Caps the loads of one [`prefetch`](Self::prefetch) call; `None` (the default) means twice
    /// the top-k seen in the last routed layer.
    pub fn with_max_prefetch(mut self, max: Option<usize>) -> CacheModel {
        self.max_prefetch = max;
        self
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Counters so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Hit rate so far.
    pub fn hit_rate(&self) -> f64 {
        self.stats.hit_rate()
    }

    /// Name of the replacement policy.
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Name of the predictor, if any.
    pub fn predictor_name(&self) -> Option<&'static str> {
        self.predictor.as_ref().map(|p| p.name())
    }

    /// The EAM tracker (save its collection after a run).
    pub fn tracker(&self) -> &EamTracker {
        &self.tracker
    }

    /// The EAM tracker, mutably (load a saved collection before a run).
    pub fn tracker_mut(&mut self) -> &mut EamTracker {
        &mut self.tracker
    }

    /// Resident experts and their slots, in slot order.
    pub fn resident(&self) -> impl Iterator<Item = (ExpertId, u32)> + '_ {
        self.slots.iter().enumerate().filter_map(|(s, id)| id.map(|id| (id, s as u32)))
    }

    /// The slot holding `id`, if resident.
    pub fn slot_of(&self, id: ExpertId) -> Option<u32> {
        Some(self.slot_of[self.index(id)]).filter(|&s| s != NO_SLOT)
    }

    /// Starts a request that runs alone.
    pub fn begin_request(&mut self) {
        self.tracker.begin_request();
        self.policy.begin_request();
    }

    /// Ends the request that ran alone: its EAM joins the EAM collection.
    pub fn end_request(&mut self) {
        self.tracker.end_request();
    }

    /// Starts request `key` beside the running ones (the scheduler's); the policy sees a new
    /// request when none ran.
    pub fn begin_request_of(&mut self, key: RequestKey) {
        if self.tracker.current().is_none() {
            self.policy.begin_request();
        }
        self.tracker.begin_request_of(key);
    }

    /// Ends request `key`: its EAM joins the EAM collection.
    pub fn end_request_of(&mut self, key: RequestKey) {
        self.tracker.end_request_of(key);
    }

    /// Says which requests the next step's rows belong to, in order (a batched step's
    /// sequences); a step not told so (one sequence's MTP pass) counts its routing for the
    /// request only when one runs.
    pub fn attribute_next_step(&mut self, rows: &[StepRows]) {
        self.next_rows = rows.to_vec();
    }

    /// Starts a forward step of `n_tokens` tokens.
    pub fn begin_step(&mut self, phase: Phase, n_tokens: usize) {
        self.phase = phase;
        self.tokens = n_tokens;
        self.step_rows = std::mem::take(&mut self.next_rows);
        if self.step_rows.iter().map(|r| r.rows).sum::<usize>() != n_tokens {
            self.step_rows.clear();
        }
        self.tracker.begin_step(phase);
        self.finished_steps = self.stats.steps;
        self.stats.steps += 1;
        self.stats.tokens += n_tokens as u64;
    }

    /// Registers the routing of `layer` (every token's top-k ids, duplicates allowed) and plans
    /// residency of its distinct experts: one wave if they fit, otherwise several waves of at
    /// most `capacity` experts, each needed expert in exactly one wave (hits in the first).
    pub fn route(&mut self, layer: usize, routed: &[u32]) -> Vec<Wave> {
        let mut counts = vec![0u32; self.experts];
        for &e in routed {
            assert!((e as usize) < self.experts, "expert id {e} out of range");
            counts[e as usize] += 1;
        }
        if let Some(k) = routed.len().checked_div(self.tokens) {
            self.top_k = k;
        }
        let needed: Vec<ExpertId> =
            (0..self.experts).filter(|&e| counts[e] > 0).map(|e| ExpertId::new(layer, e)).collect();
        self.record_activations(layer, routed, &counts);
        let (hits, misses): (Vec<ExpertId>, Vec<ExpertId>) = needed.iter().partition(|&&id| self.slot_of(id).is_some());
        self.stats.hits += hits.len() as u64;
        self.stats.misses += misses.len() as u64;
        for &id in &hits {
            let i = self.index(id);
            if std::mem::take(&mut self.prefetched[i]) {
                self.stats.prefetch_used += 1;
            }
        }
        let order: Vec<ExpertId> = hits.into_iter().chain(misses).collect();
        let waves = order.chunks(self.capacity).map(|wave| self.plan_wave(layer, wave)).collect();
        self.last_needed = needed;
        waves
    }

    /// Counts `layer`'s routing (`routed`, `counts` per expert) in the EAMs: each request's rows
    /// in its own where the step's rows are attributed, else the whole step's.
    fn record_activations(&mut self, layer: usize, routed: &[u32], counts: &[u32]) {
        if self.step_rows.is_empty() || self.top_k == 0 {
            self.tracker.record_layer(layer, nonzero(counts));
            return;
        }
        let mut at = 0;
        for part in &self.step_rows {
            let own = &mut self.request_counts;
            own.fill(0);
            for &e in &routed[at..at + part.rows * self.top_k] {
                own[e as usize] += 1;
            }
            at += part.rows * self.top_k;
            self.tracker.record_layer_of(part.request, part.phase, layer, nonzero(own));
        }
    }

    /// Makes every expert of `wave` resident, evicting only experts outside it.
    fn plan_wave(&mut self, layer: usize, wave: &[ExpertId]) -> Wave {
        let misses = wave.iter().filter(|&&id| self.slot_of(id).is_none()).count();
        let from_free = misses.min(self.free.len());
        let mut slots: Vec<u32> = (0..from_free).filter_map(|_| self.free.pop_first()).collect();
        let mut out = Wave::default();
        for victim in self.victims_outside(wave, misses - from_free, layer) {
            let slot = self.evict(victim);
            out.evictions.push((victim, slot));
            slots.push(slot);
        }
        let mut slots = slots.into_iter();
        for &id in wave {
            let slot = match self.slot_of(id) {
                Some(slot) => slot,
                None => {
                    let slot = slots.next().expect("a wave never exceeds the capacity");
                    self.insert(id, slot, layer);
                    out.loads.push((id, slot));
                    slot
                }
            };
            self.access(id, layer);
            out.resident.push((id.expert, slot));
        }
        out
    }

    /// After routing `layer`: loads the predictor's most likely experts of later layers (at most
    /// the prefetch cap) into free slots, then in place of policy victims while the predictor
    /// deems the swap worth it ([`Predictor::worth_evicting`]: the likeliest candidate against
    /// the least valuable victim first). Never evicts an expert of `layer`'s routing. Apply
    /// after the layer's waves; a load into an occupied slot replaces (unmaps) its occupant.
    pub fn prefetch(&mut self, layer: usize) -> Vec<(ExpertId, u32)> {
        let Some(mut predictor) = self.predictor.take() else {
            return Vec::new();
        };
        let ctx = PolicyContext { layer, clock: self.clock, phase: self.phase, eam: &self.tracker };
        let wanted: Vec<ExpertId> =
            predictor.predict(layer, &ctx).into_iter().filter(|&id| id.layer as usize > layer).collect();
        let limit = self.max_prefetch.unwrap_or(2 * self.top_k);
        let keep = std::mem::take(&mut self.last_needed);
        let loads = self.load_predicted(Some(&mut *predictor), wanted, limit, &keep, layer, self.stats.steps);
        self.last_needed = keep;
        self.predictor = Some(predictor);
        loads
    }

    /// After a step: loads every layer's experts the predictor expects the next token to use
    /// ([`Predictor::next_token`], the prerouter's one-token-ahead prediction), nearest layer
    /// first, so all reads for token t+1 start while token t finishes. Predicted experts are
    /// never evicted for each other, and one layer's top-k of slots stays for demand loads.
    pub fn prefetch_next_token(&mut self) -> Vec<(ExpertId, u32)> {
        let Some(mut predictor) = self.predictor.take() else {
            return Vec::new();
        };
        let ctx = PolicyContext { layer: 0, clock: self.clock, phase: self.phase, eam: &self.tracker };
        let predicted = predictor.next_token(&ctx);
        // The prediction is what the next token is expected to route to (with predicted routing,
        // what it will).
        let limit = self.capacity.saturating_sub(self.top_k.max(1));
        let loads = self.load_for_next_step(Some(&mut *predictor), &predicted, limit);
        self.predictor = Some(predictor);
        loads
    }

    /// Before a step whose routing is known well enough to act on (`expected`: its experts,
    /// nearest layer first; a verify step's tokens where they routed before,
    /// [`crate::experts::route_memory::RouteMemory`]): the expected experts of the nearest
    /// layers that fit together, with room left for the largest layer's share, are kept for
    /// that step (awaited), and those not resident are loaded, into free slots and then in
    /// place of policy victims outside them. Unlike a predictor's guesses these evict without
    /// the predictor's say. Layers beyond are left to the step's own demand and the per-layer
    /// prefetch: holding them from its start would evict what the nearer layers need.
    pub fn prefetch_expected(&mut self, expected: &[ExpertId]) -> Vec<(ExpertId, u32)> {
        let layers = || expected.chunk_by(|a, b| a.layer == b.layer).map(<[ExpertId]>::len);
        let room = self.capacity.saturating_sub(layers().max().unwrap_or(0).max(self.top_k));
        // The nearest layers whose expected experts fit in `room` together.
        let mut held = 0;
        for n in layers() {
            if held + n > room {
                break;
            }
            held += n;
        }
        self.load_for_next_step(None, &expected[..held], held)
    }

    /// The current step is over and `expected` are the next step's experts: those resident are
    /// kept for it like the ones loaded now, up to `limit` of the others
    /// ([`CacheModel::load_predicted`], with `predictor`'s say on evictions where given).
    fn load_for_next_step(
        &mut self,
        predictor: Option<&mut dyn Predictor>,
        expected: &[ExpertId],
        limit: usize,
    ) -> Vec<(ExpertId, u32)> {
        self.finished_steps = self.stats.steps;
        let next = self.stats.steps + 1;
        for &id in expected {
            if self.slot_of(id).is_some() {
                let i = self.index(id);
                self.awaited_in[i] = next;
            }
        }
        self.load_predicted(predictor, expected.to_vec(), limit, expected, 0, next)
    }

    /// Loads up to `limit` of `candidates` that are not resident, into free slots and then in
    /// place of policy victims outside `keep` while `predictor` (if any) deems it worth it;
    /// they are awaited until step `step` has run.
    fn load_predicted(
        &mut self,
        mut predictor: Option<&mut dyn Predictor>,
        candidates: Vec<ExpertId>,
        limit: usize,
        keep: &[ExpertId],
        layer: usize,
        step: u64,
    ) -> Vec<(ExpertId, u32)> {
        let wanted: Vec<ExpertId> =
            candidates.into_iter().filter(|&id| self.slot_of(id).is_none()).take(limit).collect();
        let from_free = wanted.len().min(self.free.len());
        let victims = self.victims_outside(keep, wanted.len() - from_free, layer);
        let mut loads = Vec::new();
        for (i, &id) in wanted.iter().enumerate() {
            let slot = match self.free.pop_first() {
                Some(slot) => slot,
                None => {
                    let Some(&victim) = victims.get(i - from_free) else {
                        break;
                    };
                    let ctx = PolicyContext { layer, clock: self.clock, phase: self.phase, eam: &self.tracker };
                    if predictor.as_mut().is_some_and(|p| !p.worth_evicting(id, victim, &ctx)) {
                        break;
                    }
                    self.evict(victim)
                }
            };
            self.insert(id, slot, layer);
            let i = self.index(id);
            self.prefetched[i] = true;
            self.awaited_in[i] = step;
            self.stats.prefetch_issued += 1;
            loads.push((id, slot));
        }
        loads
    }

    fn index(&self, id: ExpertId) -> usize {
        id.layer as usize * self.experts + id.expert as usize
    }

    /// Whether `id` is awaited in a step that has not run, and not used there yet.
    fn awaited(&self, id: ExpertId) -> bool {
        self.awaited_in[self.index(id)] > self.finished_steps
    }

    /// Up to `n` policy victims, in eviction order, among resident experts not in `keep`.
    fn victims_outside(&mut self, keep: &[ExpertId], n: usize, layer: usize) -> Vec<ExpertId> {
        if n == 0 {
            return Vec::new();
        }
        for &id in keep {
            let i = self.index(id);
            self.pinned[i] = true;
        }
        let mut candidates: Vec<ExpertId> =
            self.resident().map(|(id, _)| id).filter(|&id| !self.pinned[self.index(id)]).collect();
        for &id in keep {
            let i = self.index(id);
            self.pinned[i] = false;
        }
        // An awaited expert (prefetched, or predicted for the next token) is kept until its use
        // in the step it is awaited in: evicting it before wastes its read. Awaited experts go
        // only when the others do not free enough slots.
        if candidates.iter().filter(|&&id| !self.awaited(id)).count() >= n {
            candidates.retain(|&id| !self.awaited(id));
        }
        let ctx = PolicyContext { layer, clock: self.clock, phase: self.phase, eam: &self.tracker };
        let picks = self.policy.victims(&candidates, n.min(candidates.len()), &ctx);
        picks.into_iter().map(|p| candidates[p]).collect()
    }

    /// Takes `victim` out of its slot and returns the slot.
    fn evict(&mut self, victim: ExpertId) -> u32 {
        let slot = self.slot_of(victim).expect("eviction candidates are resident");
        let i = self.index(victim);
        self.slots[slot as usize] = None;
        self.slot_of[i] = NO_SLOT;
        self.prefetched[i] = false;
        self.awaited_in[i] = 0;
        self.stats.evictions += 1;
        self.tell_removed(victim);
        slot
    }

    /// Tells the policy that `id` left its slot.
    fn tell_removed(&mut self, id: ExpertId) {
        let ctx = PolicyContext { layer: id.layer as usize, clock: self.clock, phase: self.phase, eam: &self.tracker };
        self.policy.on_remove(id, &ctx);
    }

    fn insert(&mut self, id: ExpertId, slot: u32, layer: usize) {
        let i = self.index(id);
        self.slots[slot as usize] = Some(id);
        self.slot_of[i] = slot;
        self.clock += 1;
        let ctx = PolicyContext { layer, clock: self.clock, phase: self.phase, eam: &self.tracker };
        self.policy.on_insert(id, &ctx);
        self.stats.loads += 1;
    }

    fn access(&mut self, id: ExpertId, layer: usize) {
        let i = self.index(id);
        self.awaited_in[i] = 0;
        self.clock += 1;
        let ctx = PolicyContext { layer, clock: self.clock, phase: self.phase, eam: &self.tracker };
        self.policy.on_access(id, &ctx);
    }
}

impl CacheModel {
    /// Frees `id`'s slot without counting an eviction: its data never arrived (a failed read),
    /// so the next need of `id` is a miss that reads it again.
    pub fn forget(&mut self, id: ExpertId) {
        if let Some(slot) = self.slot_of(id) {
            let i = self.index(id);
            self.slots[slot as usize] = None;
            self.slot_of[i] = NO_SLOT;
            self.prefetched[i] = false;
            self.awaited_in[i] = 0;
            self.free.insert(slot);
            self.tell_removed(id);
        }
    }
}

/// The (expert, tokens) pairs of per-expert `counts` that are not zero.
fn nonzero(counts: &[u32]) -> impl Iterator<Item = (usize, u32)> + '_ {
    counts.iter().enumerate().filter(|(_, &n)| n > 0).map(|(e, &n)| (e, n))
}
