//! Which experts are in GPU slots, and getting the right ones there in time.
//!
//! Two modes. **Resident**: every expert has its own slot, filled at load; nothing moves.
//! **Streaming**: a budget of slots; after each MoE layer's routing comes back to the CPU, the
//! [`CacheModel`] plans waves, missing experts are read by the [`IoPool`] (or picked up from a
//! prefetch already in flight), copied into their slots and mapped in the [`SlotTable`]. A slot
//! is only written between submissions, after the GPU finished all work that read it (the
//! routing readback waits for it), so queued work never sees a slot change under it.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::arena::{SlotArena, SlotLayout};
use super::cache_model::{CacheModel, StepRows, Wave};
use super::eam::RequestKey;
use super::io_pool::{IoPool, Ticket, Urgency};
use super::policy::{ExpertId, Phase};
use super::predictor::PredictedRouting;
use super::slot_table::{SlotTable, NO_SLOT};
use super::source::ExpertSource;
use super::trace::{TraceError, TraceEvent, TraceHeader, TraceWriter};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::store::AlignedBuf;

/// Expert-cache figures of a run (all zero but `hit_rate` = 1 when every expert is resident).
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct ExpertStats {
    /// Distinct (layer, expert) needs per step found in a slot.
    pub expert_hits: u64,
    /// Needs that had to be loaded.
    pub expert_misses: u64,
    /// `hits / (hits + misses)`.
    pub hit_rate: f64,
    /// Experts loaded ahead of need by the predictor.
    pub prefetch_issued: u64,
    /// Prefetched experts that were then used.
    pub prefetch_used: u64,
    /// Bytes read from the expert source (every finished read, prefetches that were then
    /// evicted or cancelled included).
    pub bytes_read: u64,
    /// The needed experts' own bytes: (misses + prefetches used) × one expert's data bytes
    /// (without the extent's padding) -- what a reader without waste would have read.
    pub needed_bytes: u64,
    /// Milliseconds the GPU pipeline waited for expert reads.
    pub stall_ms: f64,
    /// Milliseconds spent copying read experts into their GPU slots (`queue.write_buffer`).
    pub upload_ms: f64,
    /// Milliseconds during which at least one expert read was in flight.
    pub io_busy_ms: f64,
    /// Sum of every read's own duration, in milliseconds.
    pub io_read_ms: f64,
    /// CPU milliseconds the reader threads spent in reads.
    pub io_cpu_ms: f64,
    /// Decode steps run optimistically as one submission and kept (every routed expert was
    /// already in a slot; [`crate::decoder::OptimisticSteps`]).
    pub optimistic_steps: u64,
    /// Optimistic steps discarded (a routed expert had no slot) and run again layer by layer.
    pub optimistic_discarded: u64,
}

impl std::fmt::Display for ExpertStats {
    /// One line: hit rate, hits and misses, prefetches used of issued, MiB read, stall time.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hit rate {:.1}% ({} hits, {} misses), prefetch {}/{} used, {:.1} MiB read, {:.0} ms stalled",
            self.hit_rate * 100.0,
            self.expert_hits,
            self.expert_misses,
            self.prefetch_used,
            self.prefetch_issued,
            self.bytes_read as f64 / 1048576.0,
            self.stall_ms
        )?;
        if self.optimistic_steps + self.optimistic_discarded > 0 {
            write!(f, ", {} optimistic steps ({} run again)", self.optimistic_steps, self.optimistic_discarded)?;
        }
        Ok(())
    }
}

impl ExpertStats {
    /// The figures accumulated since `before` was taken.
    pub fn since(&self, before: &ExpertStats) -> ExpertStats {
        let hits = self.expert_hits - before.expert_hits;
        let misses = self.expert_misses - before.expert_misses;
        ExpertStats {
            expert_hits: hits,
            expert_misses: misses,
            hit_rate: if hits + misses == 0 { self.hit_rate } else { hits as f64 / (hits + misses) as f64 },
            prefetch_issued: self.prefetch_issued - before.prefetch_issued,
            prefetch_used: self.prefetch_used - before.prefetch_used,
            bytes_read: self.bytes_read - before.bytes_read,
            needed_bytes: self.needed_bytes - before.needed_bytes,
            stall_ms: self.stall_ms - before.stall_ms,
            upload_ms: self.upload_ms - before.upload_ms,
            io_busy_ms: self.io_busy_ms - before.io_busy_ms,
            io_read_ms: self.io_read_ms - before.io_read_ms,
            io_cpu_ms: self.io_cpu_ms - before.io_cpu_ms,
            optimistic_steps: self.optimistic_steps - before.optimistic_steps,
            optimistic_discarded: self.optimistic_discarded - before.optimistic_discarded,
        }
    }
}

struct Streaming {
    cache: CacheModel,
    pool: IoPool,
    /// Reads in flight into a slot, by expert.
    pending: HashMap<ExpertId, (u32, Ticket)>,
    /// Which expert each slot holds or is receiving.
    owner: Vec<Option<ExpertId>>,
    stall: Duration,
    upload: Duration,
    /// The current step's routing, by model layer (empty: not routed in it), for the engine
    /// to remember per sequence ([`ExpertResidency::step_routing`]).
    step_routes: Vec<Vec<u32>>,
}

/// The slot arena, the slot table and how they are kept filled.
pub struct ExpertResidency {
    /// The GPU slots.
    pub arena: SlotArena,
    /// The (layer, expert) → slot map the kernels read.
    pub table: SlotTable,
    /// Where experts are read from (also each layer's slot layout).
    source: Arc<dyn ExpertSource>,
    streaming: Option<Streaming>,
    trace: Option<TraceRecorder>,
    /// Optimistic steps kept and discarded.
    optimistic: (u64, u64),
}

/// Routing of the current step, written as one trace event when the step ends.
struct TraceRecorder {
    writer: TraceWriter<BufWriter<File>>,
    phase: Phase,
    tokens: usize,
    layers: Vec<(u32, Vec<u32>)>,
    requests: u64,
}

impl ExpertResidency {
    /// Every expert of `moe_layers` in its own slot, read now.
    pub fn resident(
        gpu: &Gpu,
        arena: SlotArena,
        mut table: SlotTable,
        source: Arc<dyn ExpertSource>,
        moe_layers: &[usize],
        experts: usize,
    ) -> Result<Self> {
        let mut buf = vec![0u8; source.read_len()];
        for (m, &layer) in moe_layers.iter().enumerate() {
            for e in 0..experts {
                source.read(layer, e, &mut buf)?;
                let slot = m * experts + e;
                arena.write(gpu, slot, &buf);
                gpu.bound_staging(arena.layout.slot_bytes as u64);
                table.set(gpu, layer, e, slot as u32);
            }
        }
        Ok(ExpertResidency { arena, table, source, streaming: None, trace: None, optimistic: (0, 0) })
    }

    /// A budget of `arena.slots` slots filled on demand under `cache`'s policy, read by
    /// `io_threads` threads.
    pub fn streaming(
        arena: SlotArena,
        table: SlotTable,
        source: Arc<dyn ExpertSource>,
        cache: CacheModel,
        io_threads: usize,
    ) -> Self {
        let owner = vec![None; arena.slots];
        let pool = IoPool::new(source.clone(), io_threads);
        let streaming = Streaming {
            cache,
            pool,
            pending: HashMap::new(),
            owner,
            stall: Duration::ZERO,
            upload: Duration::ZERO,
            step_routes: Vec::new(),
        };
        ExpertResidency { arena, table, source, streaming: Some(streaming), trace: None, optimistic: (0, 0) }
    }

    /// The slot layout of model layer `layer`'s experts (its formats and offsets within a
    /// slot of `arena.layout.slot_bytes`).
    pub fn layer_layout(&self, layer: usize) -> SlotLayout {
        self.source.layer_layout(layer)
    }

    /// Whether experts move.
    pub fn is_streaming(&self) -> bool {
        self.streaming.is_some()
    }

    /// Whether routing must come back to the CPU after each MoE layer (streaming or tracing).
    pub fn needs_routing(&self) -> bool {
        self.streaming.is_some() || self.trace.is_some()
    }

    /// Writes every step's routing to `path` (see [`crate::experts::trace`]).
    pub fn start_trace(&mut self, path: &Path, header: &TraceHeader) -> Result<()> {
        let writer = TraceWriter::create(path, header).map_err(trace_err)?;
        self.trace = Some(TraceRecorder { writer, phase: Phase::Prefill, tokens: 0, layers: Vec::new(), requests: 0 });
        Ok(())
    }

    /// Flushes the trace, if one is being written.
    pub fn finish_trace(&mut self) -> Result<()> {
        match self.trace.take() {
            Some(t) => t.writer.finish().map(|_| ()).map_err(trace_err),
            None => Ok(()),
        }
    }

    /// A request (prompt + generation) starts.
    pub fn begin_request(&mut self) -> Result<()> {
        if let Some(s) = &mut self.streaming {
            s.cache.begin_request();
        }
        self.mark_request_in_trace()
    }

    /// Marks the start of a request in the trace (if one is written).
    fn mark_request_in_trace(&mut self) -> Result<()> {
        if let Some(t) = &mut self.trace {
            t.writer.request(t.requests).map_err(trace_err)?;
            t.requests += 1;
        }
        Ok(())
    }

    /// The request ends (EAMC files its activation matrix).
    pub fn end_request(&mut self) {
        if let Some(s) = &mut self.streaming {
            s.cache.end_request();
        }
    }

    /// Request `key` starts beside the running ones (the scheduler's): the expert cache keeps an
    /// activation matrix of its own for it ([`CacheModel::begin_request_of`]); the trace marks a
    /// request where `spell_starts` (the first of a spell of requests run together).
    pub fn begin_request_of(&mut self, key: RequestKey, spell_starts: bool) -> Result<()> {
        if let Some(s) = &mut self.streaming {
            s.cache.begin_request_of(key);
        }
        match spell_starts {
            true => self.mark_request_in_trace(),
            false => Ok(()),
        }
    }

    /// Request `key` ends: EAMC files its activation matrix.
    pub fn end_request_of(&mut self, key: RequestKey) {
        if let Some(s) = &mut self.streaming {
            s.cache.end_request_of(key);
        }
    }

    /// Which requests the next step's rows belong to ([`CacheModel::attribute_next_step`]).
    pub fn attribute_next_step(&mut self, rows: &[StepRows]) {
        if let Some(s) = &mut self.streaming {
            s.cache.attribute_next_step(rows);
        }
    }

    /// The step's routing is complete: writes it to the trace.
    pub fn end_step(&mut self) -> Result<()> {
        if let Some(t) = &mut self.trace {
            let layers = std::mem::take(&mut t.layers);
            t.writer.step(t.phase, t.tokens, &layers).map_err(trace_err)?;
        }
        Ok(())
    }

    /// The cache model, when streaming.
    pub fn cache(&self) -> Option<&CacheModel> {
        self.streaming.as_ref().map(|s| &s.cache)
    }

    /// The cache model, when streaming (for request boundaries and EAMC persistence).
    pub fn cache_mut(&mut self) -> Option<&mut CacheModel> {
        self.streaming.as_mut().map(|s| &mut s.cache)
    }

    /// Marks the start of a step of `n_tokens` tokens.
    pub fn begin_step(&mut self, phase: Phase, n_tokens: usize) {
        if let Some(s) = &mut self.streaming {
            s.cache.begin_step(phase, n_tokens);
            s.step_routes.iter_mut().for_each(Vec::clear);
        }
        if let Some(t) = &mut self.trace {
            t.phase = phase;
            t.tokens = n_tokens;
        }
    }

    /// Plans the residency of `layer`'s routed experts (`routed`: every token's top-k ids).
    pub fn route(&mut self, layer: usize, routed: &[u32]) -> Vec<Wave> {
        if let Some(t) = &mut self.trace {
            t.layers.push((layer as u32, routed.to_vec()));
        }
        match &mut self.streaming {
            Some(s) => {
                if s.step_routes.len() <= layer {
                    s.step_routes.resize(layer + 1, Vec::new());
                }
                let kept = &mut s.step_routes[layer];
                kept.clear();
                kept.extend_from_slice(routed);
                s.cache.route(layer, routed)
            }
            None => Vec::new(),
        }
    }

    /// When streaming, model layer `layer`'s routing in the step that ran last (every row's
    /// top-k ids, as [`Self::route`] was given them; empty when it did not route).
    pub fn step_routing(&self, layer: usize) -> &[u32] {
        let routes = self.streaming.as_ref().and_then(|s| s.step_routes.get(layer));
        routes.map_or(&[], Vec::as_slice)
    }

    /// Makes `wave` resident in `layer`: evicted experts unmapped, loads waited for and copied
    /// into their slots, every expert of the wave mapped. Call before recording the wave's
    /// expert kernel, with no GPU work in flight that reads the slots being written.
    pub fn apply_wave(&mut self, gpu: &Gpu, layer: usize, wave: &Wave) -> Result<()> {
        let result = self.try_apply_wave(gpu, layer, wave);
        if result.is_err() {
            self.resync(gpu);
        }
        result
    }

    /// After a failed step: the cache forgets every expert it places in a slot that does not
    /// actually hold it (failed reads, and later waves of the step that never ran), so nothing
    /// stale is ever mapped and later steps read those experts again.
    fn resync(&mut self, gpu: &Gpu) {
        let Some(s) = self.streaming.as_mut() else { return };
        let planned: Vec<(ExpertId, u32)> = s.cache.resident().collect();
        for (id, slot) in planned {
            let holds = s.owner[slot as usize] == Some(id)
                && (self.table.get(id.layer as usize, id.expert as usize) == Some(slot) || s.pending.contains_key(&id));
            if !holds {
                s.cache.forget(id);
                if let Some(other) = s.owner[slot as usize].take() {
                    if self.table.get(other.layer as usize, other.expert as usize) == Some(slot) {
                        self.table.set(gpu, other.layer as usize, other.expert as usize, NO_SLOT);
                    }
                    if let Some((_, ticket)) = s.pending.remove(&other) {
                        s.pool.cancel(ticket);
                    }
                }
            }
        }
    }

    fn try_apply_wave(&mut self, gpu: &Gpu, layer: usize, wave: &Wave) -> Result<()> {
        let Some(s) = self.streaming.as_mut() else { return Ok(()) };
        let tickets: Vec<(ExpertId, u32, Ticket)> = wave
            .loads
            .iter()
            .map(|&(id, slot)| {
                claim(s, &mut self.table, gpu, slot, id);
                (id, slot, s.pool.submit(id, Urgency::Demand))
            })
            .collect();
        // Hits that are prefetches still in flight must land before the kernel runs too.
        let in_flight: Vec<(ExpertId, u32, Ticket)> = wave
            .resident
            .iter()
            .filter_map(|&(expert, _)| {
                let id = ExpertId::new(layer, expert as usize);
                s.pending.remove(&id).map(|(slot, ticket)| (id, slot, ticket))
            })
            .collect();
        let mut failure = None;
        for (id, slot, ticket) in tickets.into_iter().chain(in_flight) {
            if failure.is_some() {
                s.pool.cancel(ticket);
                release(s, &mut self.table, gpu, id, slot);
                continue;
            }
            let waiting = Instant::now();
            let data = s.pool.wait(ticket);
            s.stall += waiting.elapsed();
            if let Err(e) = land(s, &self.arena, &mut self.table, gpu, id, slot, data) {
                failure = Some(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Starts the predictor's prefetches after `layer`'s routing.
    pub fn prefetch(&mut self, gpu: &Gpu, layer: usize) {
        self.start_prefetches(gpu, |cache| cache.prefetch(layer));
    }

    /// Starts the predictor's prefetches for the next token between steps
    /// ([`CacheModel::prefetch_next_token`]), `predicted` being the prerouter's prediction it
    /// reads; the trace records that prediction.
    pub fn prefetch_next_token(&mut self, gpu: &Gpu, predicted: &PredictedRouting) -> Result<()> {
        if let Some(t) = &mut self.trace {
            t.writer.event(&TraceEvent::Predicted(predicted.layers())).map_err(trace_err)?;
        }
        self.start_prefetches(gpu, CacheModel::prefetch_next_token);
        Ok(())
    }

    /// Starts reading the experts the next step is expected to route to (nearest layer first;
    /// [`CacheModel::prefetch_expected`]) before it runs.
    pub fn prefetch_expected(&mut self, gpu: &Gpu, expected: &[ExpertId]) {
        self.start_prefetches(gpu, |cache| cache.prefetch_expected(expected));
    }

    /// Whether a routing trace is being written.
    pub fn is_tracing(&self) -> bool {
        self.trace.is_some()
    }

    fn start_prefetches(&mut self, gpu: &Gpu, plan: impl FnOnce(&mut CacheModel) -> Vec<(ExpertId, u32)>) {
        let Some(s) = self.streaming.as_mut() else { return };
        for (id, slot) in plan(&mut s.cache) {
            claim(s, &mut self.table, gpu, slot, id);
            let ticket = s.pool.submit(id, Urgency::Prefetch);
            s.pending.insert(id, (slot, ticket));
        }
    }

    /// Copies finished prefetches into their slots and maps them (without waiting).
    pub fn land_prefetches(&mut self, gpu: &Gpu) -> Result<()> {
        let Some(s) = self.streaming.as_mut() else { return Ok(()) };
        let finished: Vec<(ExpertId, u32, Result<AlignedBuf>)> = s
            .pending
            .iter()
            .filter_map(|(&id, &(slot, ticket))| s.pool.try_take(ticket).map(|r| (id, slot, r)))
            .collect();
        let mut failure = None;
        for (id, slot, data) in finished {
            s.pending.remove(&id);
            if let Err(e) = land(s, &self.arena, &mut self.table, gpu, id, slot, data) {
                failure.get_or_insert(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// Counts an optimistic step, `kept` or discarded.
    pub fn count_optimistic(&mut self, kept: bool) {
        match kept {
            true => self.optimistic.0 += 1,
            false => self.optimistic.1 += 1,
        }
    }

    /// The figures so far.
    pub fn stats(&self) -> ExpertStats {
        let (optimistic_steps, optimistic_discarded) = self.optimistic;
        match &self.streaming {
            None => ExpertStats { hit_rate: 1.0, optimistic_steps, optimistic_discarded, ..Default::default() },
            Some(s) => {
                let c = s.cache.stats();
                let io = s.pool.counters();
                let ms = |d: Duration| d.as_secs_f64() * 1e3;
                ExpertStats {
                    expert_hits: c.hits,
                    expert_misses: c.misses,
                    hit_rate: c.hit_rate(),
                    prefetch_issued: c.prefetch_issued,
                    prefetch_used: c.prefetch_used,
                    bytes_read: io.bytes,
                    needed_bytes: (c.misses + c.prefetch_used) * self.arena.layout.slot_bytes as u64,
                    stall_ms: ms(s.stall),
                    upload_ms: ms(s.upload),
                    io_busy_ms: ms(io.busy),
                    io_read_ms: ms(io.read_time),
                    io_cpu_ms: ms(io.cpu_time),
                    optimistic_steps,
                    optimistic_discarded,
                }
            }
        }
    }
}

/// Puts a finished read of `id` into `slot` and maps it, or, when the read failed, releases
/// the slot and returns the error.
fn land(
    s: &mut Streaming,
    arena: &SlotArena,
    table: &mut SlotTable,
    gpu: &Gpu,
    id: ExpertId,
    slot: u32,
    data: Result<AlignedBuf>,
) -> Result<()> {
    match data {
        Ok(buf) => {
            let copying = Instant::now();
            arena.write(gpu, slot as usize, &buf);
            s.upload += copying.elapsed();
            s.pool.recycle(buf);
            table.set(gpu, id.layer as usize, id.expert as usize, slot);
            Ok(())
        }
        Err(e) => {
            release(s, table, gpu, id, slot);
            Err(e)
        }
    }
}

/// Undoes the claim of `slot` by `id` whose data did not arrive: the cache forgets it, the
/// slot is free and unmapped, so later steps read it again instead of using stale bytes.
fn release(s: &mut Streaming, table: &mut SlotTable, gpu: &Gpu, id: ExpertId, slot: u32) {
    s.cache.forget(id);
    if s.owner[slot as usize] == Some(id) {
        s.owner[slot as usize] = None;
    }
    if table.get(id.layer as usize, id.expert as usize) == Some(slot) {
        table.set(gpu, id.layer as usize, id.expert as usize, NO_SLOT);
    }
}

/// Gives `slot` to `id`: unmaps its previous owner (cancelling that owner's read if still in
/// flight) so no kernel reads the slot until `id`'s data has landed and is mapped.
fn claim(s: &mut Streaming, table: &mut SlotTable, gpu: &Gpu, slot: u32, id: ExpertId) {
    if let Some(old) = s.owner[slot as usize].replace(id) {
        if table.get(old.layer as usize, old.expert as usize) == Some(slot) {
            table.set(gpu, old.layer as usize, old.expert as usize, NO_SLOT);
        }
        if let Some((_, ticket)) = s.pending.remove(&old) {
            s.pool.cancel(ticket);
        }
    }
}

fn trace_err(e: TraceError) -> Error {
    Error::InvalidArgument(format!("trace: {e}"))
}
