//! Running one step: the dispatch list recorded in as few submissions as possible. With
//! streaming (or tracing, or a layer observer) each MoE layer's routing comes back to the CPU
//! (unless predicted routing already told it), the expert residency brings the routed experts
//! into slots (in waves when they exceed the budget), and recording resumes; otherwise the
//! whole step is one submission. An optimistic decode step ([`super::optimistic`]) is one
//! submission too, its routing logged and looked at afterwards.

use super::batch::BatchEntry;
use super::{Ffn, GpuModel, Layer, MoeFfn, Observer, SequenceCache, StepOutput, StepResult};
use crate::error::{Error, Result};
use crate::experts::policy::Phase;
use crate::experts::residency::ExpertResidency;
use crate::gpu::Pass;
use crate::ops::experts::ExpertFfn;

/// Rows of logits read back with one wait ([`GpuModel::read_logit_rows`]; the readback holds
/// this many).
pub(super) const LOGIT_ROWS: usize = 8;

/// How a step's MoE routing reaches the expert residency.
#[derive(Clone, Debug)]
pub(super) enum Routing {
    /// Each layer's routing comes back before its experts run (when the residency needs it),
    /// but for the first MoE layers' routed ids in `known` (those a discarded optimistic step
    /// computed exactly, [`super::optimistic`]); `all_hit` is left true when every routed
    /// expert was already in a slot.
    PerLayer { all_hit: bool, known: Vec<u32> },
    /// The experts run on the slot table as it stands, each layer's routed ids copied into
    /// `routing_log`'s staging buffer for the residency to look at after the step
    /// ([`super::optimistic`]).
    Logged,
}

/// Where a step's token ids are on the GPU.
#[derive(Clone, Copy, Debug)]
pub(super) enum TokenSource {
    /// `acts.tokens`, written by the host.
    Host,
    /// `acts.argmax`: the greedy token of the step before (one token).
    PreviousArgmax,
}

/// The sequences a step runs on.
#[derive(Clone, Copy)]
pub(super) enum Sequences<'a> {
    /// One sequence, the step's tokens at positions `pos..`.
    One { cache: &'a SequenceCache, pos: usize },
    /// Several, each its own rows of the step's tokens in turn ([`super::batch`]).
    Batch(&'a [BatchEntry<'a>]),
}

impl Sequences<'_> {
    /// The one sequence and its start, unless this is a batch.
    fn one(&self) -> Option<(&SequenceCache, usize)> {
        match *self {
            Sequences::One { cache, pos } => Some((cache, pos)),
            Sequences::Batch(_) => None,
        }
    }

    /// Readies the caches (linear-attention states checked) and the step uniform for a step
    /// of `n` tokens.
    fn begin(&self, model: &GpuModel, gpu: &crate::gpu::Gpu, n: usize) -> Result<()> {
        match *self {
            Sequences::One { cache, pos } => {
                cache.begin_step(gpu, pos, n)?;
                model.step.set(gpu, n, pos);
            }
            Sequences::Batch(entries) => {
                for e in entries {
                    e.cache.begin_step(gpu, e.pos, e.tokens.len())?;
                }
                model.write_batch_values(entries);
            }
        }
        Ok(())
    }
}

impl GpuModel {
    /// Runs `tokens` (at most `max_batch`) at positions `pos..` of the sequence held by
    /// `cache` (whose positions `..pos` must hold that sequence), extending it, and returns what
    /// `output` asks for. `phase` tells the expert cache whether this is prompt processing or
    /// generation.
    pub fn step(
        &self,
        cache: &SequenceCache,
        tokens: &[u32],
        pos: usize,
        phase: Phase,
        output: StepOutput<'_>,
    ) -> Result<StepResult> {
        let n = tokens.len();
        self.check_step(cache, tokens, n, pos)?;
        let gpu = &*self.gpu;
        if let StepOutput::LogProbs(targets) = output {
            if targets.len() != n {
                return Err(Error::InvalidArgument("one target per token is needed".into()));
            }
            if let Some(&bad) = targets.iter().find(|&&t| t as usize >= self.spec.vocab) {
                return Err(Error::TokenOutOfRange { id: bad, vocab: self.spec.vocab });
            }
            gpu.queue.write_buffer(&self.acts.targets, 0, bytemuck::cast_slice(targets));
        }
        gpu.queue.write_buffer(&self.acts.tokens, 0, bytemuck::cast_slice(tokens));
        let result = self.run_step(cache, n, pos, phase, output)?;
        self.finish_step(n, pos + n)?;
        Ok(result)
    }

    /// After a step of `n` tokens (the longest sequence now `kv_len` long): the profiler's
    /// figures, and the prefetch of the experts the prerouter heads predicted.
    pub(super) fn finish_step(&self, n: usize, kv_len: usize) -> Result<()> {
        let gpu = &*self.gpu;
        if let Some(profiler) = gpu.profiler() {
            profiler.end_step(gpu, n, kv_len)?;
        }
        if self.prerouter.as_ref().map(|p| p.finish_step(gpu, &self.predicted)).transpose()? == Some(true) {
            if let Some(mut r) = self.residency() {
                r.prefetch_next_token(gpu, &self.predicted)?;
            }
        }
        Ok(())
    }

    /// Refuses a step of `n` tokens at `pos` on `cache` that the model cannot run: none or more
    /// than `max_batch`, another model's cache, past the context, one of `tokens` (those the
    /// host gives) out of the vocabulary.
    pub(super) fn check_step(&self, cache: &SequenceCache, tokens: &[u32], n: usize, pos: usize) -> Result<()> {
        if n == 0 || n > self.options.max_batch {
            return Err(Error::InvalidArgument(format!("step of {n} tokens (1..={} allowed)", self.options.max_batch)));
        }
        if !self.owns(cache) {
            return Err(Error::InvalidArgument("the sequence cache belongs to another model".into()));
        }
        if pos + n > self.options.context {
            return Err(Error::ContextOverflow { requested: pos + n, context: self.options.context });
        }
        if let Some(m) = self.spec.mla().filter(|_| self.gpu.adapter.software && n > 1) {
            let limit = crate::ops::mla_attention::software_key_limit(m);
            if pos + n > limit {
                return Err(Error::UnsupportedConfig(format!(
                    "a step of {n} tokens over {} positions of MLA attention on a software adapter: past {limit} positions \
                     its kernel would pass lavapipe's limit of 65535 loop iterations per shader invocation and give wrong \
                     results (decode one token at a time goes on; use a GPU for longer prompts)",
                    pos + n
                )));
            }
        }
        match tokens.iter().find(|&&t| t as usize >= self.spec.vocab) {
            Some(&bad) => Err(Error::TokenOutOfRange { id: bad, vocab: self.spec.vocab }),
            None => Ok(()),
        }
    }

    /// Runs the checked step of `n` tokens at `pos` (tokens and targets already written),
    /// optimistically where that is on and pays, else layer by layer, keeping the record
    /// [`OptimisticSteps::Auto`] decides by.
    pub(super) fn run_step(
        &self,
        cache: &SequenceCache,
        n: usize,
        pos: usize,
        phase: Phase,
        output: StepOutput<'_>,
    ) -> Result<StepResult> {
        let eligible = self.optimistic_eligible(phase, n);
        let started = std::time::Instant::now();
        let elapsed_ms = || started.elapsed().as_secs_f64() * 1e3;
        let tried = eligible && self.optimism.wants();
        let mut known = Vec::new();
        if tried {
            match self.try_optimistic(cache, n, pos, output)? {
                Ok(result) => {
                    self.optimism.optimistic(true, elapsed_ms());
                    return Ok(result);
                }
                Err(exact) => known = exact,
            }
            self.optimism.optimistic(false, elapsed_ms());
        }
        let mut routing = Routing::PerLayer { all_hit: true, known };
        let rec = self.record_step(
            Pass::new(&self.gpu.device),
            Sequences::One { cache, pos },
            n,
            phase,
            output,
            TokenSource::Host,
            &mut routing,
        )?;
        rec.submit(&self.gpu.queue);
        let result = self.collect(n, pos, output)?;
        cache.end_step(pos + n);
        if let (true, false, Routing::PerLayer { all_hit, .. }) = (eligible, tried, routing) {
            self.optimism.layered(all_hit, elapsed_ms());
        }
        Ok(result)
    }

    /// Records a checked step of `n` tokens (from `tokens`) of `seqs` after `rec`, submitting
    /// where the expert residency needs the routing as `routing` says, and returns the
    /// recording of the step's end, not yet submitted.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_step(
        &self,
        mut rec: Pass,
        seqs: Sequences<'_>,
        n: usize,
        phase: Phase,
        output: StepOutput<'_>,
        tokens: TokenSource,
        routing: &mut Routing,
    ) -> Result<Pass> {
        let gpu = &*self.gpu;
        seqs.begin(self, gpu, n)?;
        // What acts.argmax will hold once this step has run.
        *self.chain.argmax_of.lock().expect("chain lock") =
            seqs.one().filter(|_| matches!(output, StepOutput::Argmax)).map(|(cache, pos)| (cache.id(), pos + n));
        let logged = matches!(routing, Routing::Logged);
        // A logged step leaves the residency alone until it has been checked.
        let mut residency = self.experts.as_ref().filter(|_| !logged).map(|m| m.lock().expect("expert residency lock"));
        let mut moe_index = 0usize;
        let prerouter = self.prerouter.as_ref();
        let mut last_end = self.last_step_end.lock().expect("last step lock");
        let one = seqs.one().map(|(cache, pos)| (cache.id(), pos));
        if let Some(p) = prerouter {
            // The heads' history holds the previous token of this sequence only when the last
            // step ran on it alone and ended right here.
            p.begin_step(gpu, one.is_some() && *last_end == one);
        }
        *last_end = one.map(|(id, pos)| (id, pos + n));
        drop(last_end);
        let mut observer = self.observer.lock().expect("observer lock");
        let section = |name| {
            if let Some(p) = gpu.profiler() {
                p.set_section(name)
            }
        };
        section("embed");
        match tokens {
            TokenSource::Host => &self.embed,
            TokenSource::PreviousArgmax => &self.embed_from_argmax,
        }
        .record(gpu, &mut rec, n);
        // Heads reading this token predict its routing now, and their prefetches are planned
        // before the step begins in the residency.
        rec = self.record_heads_after_embed(rec, n, residency.as_deref_mut())?;
        if let Some(r) = residency.as_deref_mut() {
            r.begin_step(phase, n);
        }
        for (i, l) in self.layers.iter().enumerate() {
            section(l.attn.section());
            l.attn_norm.record(gpu, &mut rec, n);
            l.attn.record_inputs(gpu, &mut rec, n);
            match seqs {
                Sequences::One { cache, pos } => self.record_attention(cache, i, &mut rec, n, pos + n),
                Sequences::Batch(entries) => self.record_batched_attention(entries, i, &mut rec),
            }
            l.attn.record_output(gpu, &mut rec, n);
            section(if matches!(l.ffn, Ffn::Dense(_)) { "dense FFN" } else { "MoE FFN" });
            rec = self.record_ffn(rec, l, (i, moe_index), n, residency.as_deref_mut(), routing, &mut observer)?;
            moe_index += usize::from(matches!(l.ffn, Ffn::Moe(_)));
        }
        if let Some(r) = residency.as_deref_mut() {
            r.end_step()?;
        }
        drop(observer);
        if let Some(p) = prerouter {
            section("prerouter heads");
            p.record_heads(gpu, &mut rec);
        }
        // The MTP module reads a main step's final-norm output.
        let mtp = self.mtp.as_ref();
        if !matches!(output, StepOutput::None) || mtp.is_some() {
            section("final norm + lm_head");
            self.final_norm.record(gpu, &mut rec, n);
            if let Some(m) = mtp {
                m.keep_hidden(rec.encoder(), &self.acts.hn, n);
            }
            match output {
                StepOutput::None => {}
                StepOutput::LogProbs(_) => {
                    self.lm_head.record(gpu, &mut rec, n);
                    self.token_logprob.record(gpu, &mut rec, n);
                }
                // Each sequence's last token has its own row among the step's.
                StepOutput::Logits if matches!(seqs, Sequences::Batch(_)) => self.lm_head.record(gpu, &mut rec, n),
                StepOutput::AllLogits => self.lm_head.record(gpu, &mut rec, n),
                _ => {
                    // The greedy token and the logits are the last token's: its row only.
                    self.lm_head_last.record(gpu, &mut rec, n);
                    if matches!(output, StepOutput::Argmax) {
                        self.argmax.record(gpu, &mut rec);
                    }
                }
            }
        }
        Ok(rec)
    }

    /// Records layer `l`'s FFN (model layer `i`, the `moe_index`-th MoE layer) after `rec`: a
    /// dense MLP, or the router, its top-k (the prerouter's forced routing where it routes)
    /// and the routed experts, resident or brought into slots as the `residency` needs (which
    /// submits), then the shared expert and the combine. Returns the pass to go on with.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_ffn(
        &self,
        mut rec: Pass,
        l: &Layer,
        (i, moe_index): (usize, usize),
        n: usize,
        residency: Option<&mut ExpertResidency>,
        routing: &mut Routing,
        observer: &mut Option<Observer>,
    ) -> Result<Pass> {
        let gpu = &*self.gpu;
        let moe = match &l.ffn {
            Ffn::Dense(mlp) => {
                l.ffn_norm.record(gpu, &mut rec, n);
                mlp.record(gpu, &mut rec, n);
                return Ok(rec);
            }
            Ffn::Moe(moe) => moe,
        };
        let MoeFfn { router, topk, experts, shared, combine, .. } = &**moe;
        l.ffn_norm.record(gpu, &mut rec, n);
        router.record(gpu, &mut rec, n);
        match self.prerouter.as_ref().and_then(|p| p.router(i, n)) {
            Some(own) => own.record(gpu, &mut rec, n),
            None => topk.record(gpu, &mut rec, n),
        }
        let observing = observer.is_some();
        match residency.filter(|r| observing || r.needs_routing()) {
            None => {
                experts.record(gpu, &mut rec, n);
                if matches!(routing, Routing::Logged) {
                    let k = self.spec.moe.as_ref().map_or(0, |m| m.top_k);
                    let len = (n * k * 4) as u64;
                    self.routing_log.record_copy_at(rec.encoder(), &self.acts.ids, 0, len, moe_index as u64 * len)?;
                }
            }
            Some(r) => rec = self.record_streamed_experts(rec, r, experts, (i, moe_index), n, routing, observer)?,
        }
        if let Some(s) = shared {
            s.mlp.record(gpu, &mut rec, n);
            if let Some(g) = &s.gate {
                g.record(gpu, &mut rec, n);
            }
        }
        if let Some(c) = combine {
            c.record(gpu, &mut rec, n);
        }
        Ok(rec)
    }

    /// A streamed (or traced, or observed) MoE layer's experts: submits what `rec` holds (slot
    /// writes must not overtake recorded work), learns the layer's routing (known from a
    /// discarded optimistic step, published by the prerouter, or read back), shows it to the
    /// observer, brings the routed experts into slots wave by wave running the experts after
    /// each, starts the prefetches for later layers and returns a fresh pass.
    #[allow(clippy::too_many_arguments)]
    fn record_streamed_experts(
        &self,
        rec: Pass,
        r: &mut ExpertResidency,
        experts: &ExpertFfn,
        (layer, moe_index): (usize, usize),
        n: usize,
        routing: &mut Routing,
        observer: &mut Option<Observer>,
    ) -> Result<Pass> {
        let gpu = &*self.gpu;
        let k = self.spec.moe.as_ref().map_or(0, |m| m.top_k);
        let observing = observer.is_some();
        let published = self.prerouter.as_ref().is_some_and(|p| !observing && p.routing_is_published(layer, n));
        let layer_ids = moe_index * n * k..(moe_index + 1) * n * k;
        let logged = match &*routing {
            Routing::PerLayer { known, .. } => known.get(layer_ids).map(<[u32]>::to_vec),
            Routing::Logged => None,
        };
        let known = logged.or_else(|| published.then(|| self.predicted.ids_of(layer)).flatten());
        let routed = match known {
            Some(ids) => {
                rec.submit(&gpu.queue);
                ids
            }
            None => self.submit_and_read_routing(rec, n)?,
        };
        if let Some(o) = observer.as_mut() {
            let mut hn = vec![0f32; n * self.spec.hidden];
            o.readback.read(gpu, &self.acts.hn, 0, bytemuck::cast_slice_mut(&mut hn))?;
            (o.callback)(layer, &hn, &routed);
        }
        if let Routing::PerLayer { all_hit, .. } = routing {
            *all_hit &= routed.iter().all(|&e| r.table.get(layer, e as usize).is_some());
        }
        let waves = r.route(layer, &routed);
        for wave in &waves {
            r.apply_wave(gpu, layer, wave)?;
            let mut wave_rec = Pass::new(&gpu.device);
            experts.record(gpu, &mut wave_rec, n);
            wave_rec.submit(&gpu.queue);
        }
        if waves.is_empty() {
            // Tracing a resident model: nothing moves.
            let mut wave_rec = Pass::new(&gpu.device);
            experts.record(gpu, &mut wave_rec, n);
            wave_rec.submit(&gpu.queue);
        }
        r.prefetch(gpu, layer);
        r.land_prefetches(gpu)?;
        Ok(Pass::new(&gpu.device))
    }

    /// Submits `rec`, which computes the routing, with the copy of its routed expert ids (every
    /// token of the step) appended, and waits for them: one submission per MoE layer, not two.
    fn submit_and_read_routing(&self, rec: Pass, n: usize) -> Result<Vec<u32>> {
        let k = self.spec.moe.as_ref().map_or(0, |m| m.top_k);
        let mut ids = vec![0u32; n * k];
        self.routing_readback.read_after(&self.gpu, rec, &self.acts.ids, 0, bytemuck::cast_slice_mut(&mut ids))?;
        Ok(ids)
    }

    /// Reads the step's output back; NaN or infinite logits (the kernels flag them) are
    /// [`Error::NonFiniteOutput`], never a token.
    pub(super) fn collect(&self, n: usize, pos: usize, output: StepOutput<'_>) -> Result<StepResult> {
        let gpu = &*self.gpu;
        let last = pos + n - 1;
        Ok(match output {
            StepOutput::None => {
                gpu.wait()?;
                StepResult::None
            }
            StepOutput::Argmax => {
                let mut id = [0u8; 4];
                self.readback.read(gpu, &self.acts.argmax, 0, &mut id)?;
                StepResult::Token(Self::greedy_token(u32::from_le_bytes(id), last)?)
            }
            StepOutput::Logits => {
                StepResult::Logits(self.read_logit_rows(&[(n - 1, last)])?.pop().expect("one row asked for"))
            }
            StepOutput::AllLogits => {
                let rows: Vec<(usize, usize)> = (0..n).map(|i| (i, pos + i)).collect();
                StepResult::AllLogits(self.read_logit_rows(&rows)?)
            }
            StepOutput::LogProbs(_) => {
                let mut lp = vec![0f32; n];
                self.readback.read(gpu, &self.acts.logprobs, 0, bytemuck::cast_slice_mut(&mut lp))?;
                if let Some(t) = lp.iter().position(|l| !l.is_finite()) {
                    return Err(Error::NonFiniteOutput { what: "log-probabilities", position: pos + t });
                }
                StepResult::LogProbs(lp)
            }
        })
    }

    /// The logits of `rows` (each a row of `acts.logits` and the position it follows) read
    /// back, [`LOGIT_ROWS`] in one copy and wait; NaN or infinite logits are
    /// [`Error::NonFiniteOutput`].
    pub(super) fn read_logit_rows(&self, rows: &[(usize, usize)]) -> Result<Vec<Vec<f32>>> {
        let (gpu, v) = (&*self.gpu, self.spec.vocab);
        let row_bytes = (v * 4) as u64;
        let mut out = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(LOGIT_ROWS) {
            let mut rec = Pass::new(&gpu.device);
            for (k, &(row, _)) in chunk.iter().enumerate() {
                let (from, to) = (row as u64 * row_bytes, k as u64 * row_bytes);
                self.readback.record_copy_at(rec.encoder(), &self.acts.logits, from, row_bytes, to)?;
            }
            let submission = rec.submit(&gpu.queue);
            let mut flat = vec![0f32; chunk.len() * v];
            let read = self.readback.map(chunk.len() as u64 * row_bytes);
            read.finish(gpu, Some(submission), bytemuck::cast_slice_mut(&mut flat))?;
            for (&(_, position), logits) in chunk.iter().zip(flat.chunks_exact(v)) {
                if !logits.iter().all(|l| l.is_finite()) {
                    return Err(Error::NonFiniteOutput { what: "logits", position });
                }
                out.push(logits.to_vec());
            }
        }
        Ok(out)
    }

    /// The greedy token `id` the argmax kernel wrote for position `last`; it writes
    /// `u32::MAX` for NaN or infinite logits: [`Error::NonFiniteOutput`].
    pub(super) fn greedy_token(id: u32, last: usize) -> Result<u32> {
        match id {
            u32::MAX => Err(Error::NonFiniteOutput { what: "logits", position: last }),
            id => Ok(id),
        }
    }

    /// The expert residency (slots, cache, stats), for MoE models.
    pub fn residency(&self) -> Option<std::sync::MutexGuard<'_, ExpertResidency>> {
        self.experts.as_ref().map(|m| m.lock().expect("expert residency lock"))
    }
}
