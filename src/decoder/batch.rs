//! Batched steps: one step over the tokens of several sequences, each at its own position with
//! its own caches. What does not depend on a token's position or sequence — norms,
//! projections, the router, the routed experts, the lm_head — runs once over the whole batch's
//! rows, so every weight and every routed expert is read once per step for all the tokens that
//! use it. Each layer's cache part (MLA's RoPE, the cache store with the grouped layers' RoPE,
//! the attention and its merge, or the linear attention's conv and recurrence) runs per
//! sequence: its rows are copied to the front of the activation buffers, the step uniform takes
//! its token count and position (copied from a table the host writes once per step), the cache
//! kernels run exactly as in a step of that sequence alone, and the output rows are copied back
//! to the sequence's place. A sequence's tokens therefore see the same computation alone or in
//! a batch (the shared kernels compute each row on its own; their results can differ only in
//! rounding where a kernel's form depends on the step's token count).

use super::step::{Routing, Sequences, TokenSource};
use super::{Activations, Attn, GpuModel, SequenceCache, StepOutput, StepResult};
use crate::error::{Error, Result};
use crate::experts::policy::Phase;
use crate::gpu::{Gpu, Pass, StepValues};
use crate::model::ArchSpec;

/// One sequence's part of a batched step ([`GpuModel::step_batch`]).
#[derive(Clone, Copy)]
pub struct BatchEntry<'a> {
    /// The sequence's caches, holding its positions `..pos`.
    pub cache: &'a SequenceCache,
    /// Its tokens in this step (a decode token, or a chunk of its prompt).
    pub tokens: &'a [u32],
    /// The position of the first of them.
    pub pos: usize,
    /// Which of its tokens' logits are wanted.
    pub logits: Rows,
}

/// The logits a batch entry asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// None (a prompt chunk before the last).
    None,
    /// After its last token (the next token's).
    Last,
    /// After each of its tokens (a prompt's log-probabilities).
    All,
}

/// The buffers batched steps use besides the activations: the step values of each sequence
/// and a copy of the batch's rows of each cache part's inputs and outputs.
pub(super) struct BatchBuffers {
    /// [`StepValues`] of the whole batch, then of each sequence in turn.
    values: wgpu::Buffer,
    /// The batch's rows of a cache part's inputs and outputs, one after the other.
    stash: wgpu::Buffer,
}

/// The activation rows one layer's cache part reads and writes, each buffer with its width in
/// f32 values per token.
struct CacheRows<'a> {
    inputs: Vec<(&'a wgpu::Buffer, usize)>,
    outputs: Vec<(&'a wgpu::Buffer, usize)>,
    /// The inputs are read again after the cache part (the linear attention's output gate),
    /// so the batch's rows are put back.
    restore_inputs: bool,
}

impl CacheRows<'_> {
    /// The f32 values per token of all of them.
    fn width(&self) -> usize {
        self.inputs.iter().chain(&self.outputs).map(|(_, w)| w).sum()
    }
}

/// What the cache part of a layer with attention `attn` reads and writes in `acts`.
fn cache_rows<'a>(spec: &ArchSpec, acts: &'a Activations, attn: &Attn) -> CacheRows<'a> {
    match attn {
        Attn::Grouped(_) => CacheRows {
            inputs: vec![(&acts.q, spec.q_dim()), (&acts.k, spec.kv_dim()), (&acts.v, spec.kv_dim())],
            outputs: vec![(&acts.attn, spec.q_dim())],
            restore_inputs: false,
        },
        Attn::Mla(_) => {
            let m = spec.mla().expect("MLA layers imply an MLA spec");
            CacheRows {
                inputs: vec![(&acts.q, spec.q_dim()), (&acts.k, m.kv_lora_rank), (&acts.v, m.qk_rope_head_dim)],
                outputs: vec![(&acts.attn, spec.heads * m.v_head_dim)],
                restore_inputs: false,
            }
        }
        Attn::Linear(_) => {
            let hy = spec.hybrid.as_ref().expect("linear layers imply a hybrid spec");
            CacheRows {
                inputs: vec![(&acts.lin, hy.in_width())],
                outputs: vec![(&acts.core, hy.value_dim())],
                restore_inputs: true,
            }
        }
    }
}

impl BatchBuffers {
    /// The buffers for batches of up to `max_batch` tokens (and as many sequences) through
    /// layers with attention `attns`.
    pub(super) fn allocate<'a>(
        gpu: &Gpu,
        spec: &ArchSpec,
        acts: &Activations,
        attns: impl Iterator<Item = &'a Attn>,
        max_batch: usize,
    ) -> BatchBuffers {
        let width = attns.map(|a| cache_rows(spec, acts, a).width()).max().unwrap_or(0);
        BatchBuffers {
            values: gpu.storage("batch step values", ((max_batch + 1) * size_of::<StepValues>()) as u64),
            stash: gpu.storage("batch rows", (max_batch * width * 4) as u64),
        }
    }
}

const VALUES: u64 = size_of::<StepValues>() as u64;

impl GpuModel {
    /// Runs one step over `entries`' tokens (together at most `max_batch`; each sequence at
    /// most once) and returns, per entry, the logits it asked for ([`Rows`]; empty for
    /// none). Each sequence's caches end up as after a step of its own, and its logits are
    /// those that step gives. A single entry is a plain [`GpuModel::step`].
    pub fn step_batch(&self, entries: &[BatchEntry<'_>], phase: Phase) -> Result<Vec<Vec<Vec<f32>>>> {
        let n: usize = entries.iter().map(|e| e.tokens.len()).sum();
        if entries.is_empty() || n > self.options.max_batch {
            return Err(Error::InvalidArgument(format!(
                "a batched step of {} sequences and {n} tokens (together at most {})",
                entries.len(),
                self.options.max_batch
            )));
        }
        for (i, e) in entries.iter().enumerate() {
            self.check_step(e.cache, e.tokens, e.tokens.len(), e.pos)?;
            if entries[..i].iter().any(|o| o.cache.id() == e.cache.id()) {
                return Err(Error::InvalidArgument("a sequence appears twice in one batched step".into()));
            }
        }
        if let [e] = entries {
            let output = match e.logits {
                Rows::None => StepOutput::None,
                Rows::Last => StepOutput::Logits,
                Rows::All => StepOutput::AllLogits,
            };
            return Ok(vec![match self.step(e.cache, e.tokens, e.pos, phase, output)? {
                StepResult::Logits(l) => vec![l],
                StepResult::AllLogits(rows) => rows,
                _ => Vec::new(),
            }]);
        }
        let gpu = &*self.gpu;
        let tokens: Vec<u32> = entries.iter().flat_map(|e| e.tokens.iter().copied()).collect();
        gpu.queue.write_buffer(&self.acts.tokens, 0, bytemuck::cast_slice(&tokens));
        let wanted = entries.iter().any(|e| e.logits != Rows::None);
        let output = if wanted { StepOutput::Logits } else { StepOutput::None };
        let mut routing = Routing::PerLayer { all_hit: true, known: Vec::new() };
        let rec = Pass::new(&gpu.device);
        let rec =
            self.record_step(rec, Sequences::Batch(entries), n, phase, output, TokenSource::Host, &mut routing)?;
        rec.submit(&gpu.queue);
        let logits = self.collect_batch(entries)?;
        for e in entries {
            e.cache.end_step(e.pos + e.tokens.len());
        }
        self.finish_step(n, entries.iter().map(|e| e.pos + e.tokens.len()).max().unwrap_or(0))?;
        Ok(logits)
    }

    /// Writes the step values of the batch (`entries`' tokens together, from position 0) into
    /// the step uniform, and those of each entry into the table the batched attention copies
    /// from.
    pub(super) fn write_batch_values(&self, entries: &[BatchEntry<'_>]) {
        let n: usize = entries.iter().map(|e| e.tokens.len()).sum();
        let whole = StepValues { n_tokens: n as u32, pos: 0, kv_len: n as u32, pad: 0 };
        let values: Vec<StepValues> = std::iter::once(whole)
            .chain(entries.iter().map(|e| StepValues {
                n_tokens: e.tokens.len() as u32,
                pos: e.pos as u32,
                kv_len: (e.pos + e.tokens.len()) as u32,
                pad: 0,
            }))
            .collect();
        let gpu = &*self.gpu;
        gpu.queue.write_buffer(&self.batch.values, 0, bytemuck::cast_slice(&values));
        self.step.set(gpu, n, 0);
    }

    /// Records layer `layer`'s cache part for each of `entries` in turn: its rows to the
    /// front, its step values into the uniform, the cache kernels, its output rows back.
    pub(super) fn record_batched_attention(&self, entries: &[BatchEntry<'_>], layer: usize, rec: &mut Pass) {
        let rows = cache_rows(&self.spec, &self.acts, &self.layers[layer].attn);
        let b = self.options.max_batch as u64;
        let stash = &self.batch.stash;
        // Each buffer's place in the stash, in bytes.
        let mut places = Vec::new();
        let mut at = 0u64;
        for &(buf, w) in rows.inputs.iter().chain(&rows.outputs) {
            places.push((buf, w as u64 * 4, at));
            at += b * w as u64 * 4;
        }
        let (inputs, outputs) = places.split_at(rows.inputs.len());
        let n: u64 = entries.iter().map(|e| e.tokens.len() as u64).sum();
        for &(buf, row, place) in inputs {
            rec.encoder().copy_buffer_to_buffer(buf, 0, stash, place, n * row);
        }
        let mut row0 = 0u64;
        for (j, e) in entries.iter().enumerate() {
            let len = e.tokens.len() as u64;
            let encoder = rec.encoder();
            encoder.copy_buffer_to_buffer(&self.batch.values, (j as u64 + 1) * VALUES, &self.step.buffer, 0, VALUES);
            if j > 0 {
                // The first sequence's rows are at the front already.
                for &(buf, row, place) in inputs {
                    encoder.copy_buffer_to_buffer(stash, place + row0 * row, buf, 0, len * row);
                }
            }
            self.record_attention(e.cache, layer, rec, e.tokens.len(), e.pos + e.tokens.len());
            for &(buf, row, place) in outputs {
                rec.encoder().copy_buffer_to_buffer(buf, 0, stash, place + row0 * row, len * row);
            }
            row0 += len;
        }
        let encoder = rec.encoder();
        encoder.copy_buffer_to_buffer(&self.batch.values, 0, &self.step.buffer, 0, VALUES);
        let restored = if rows.restore_inputs { places.as_slice() } else { outputs };
        for &(buf, row, place) in restored {
            encoder.copy_buffer_to_buffer(stash, place, buf, 0, n * row);
        }
    }

    /// Reads the logits each entry asked for.
    fn collect_batch(&self, entries: &[BatchEntry<'_>]) -> Result<Vec<Vec<Vec<f32>>>> {
        // Each entry's wanted rows (row of the step, position), all read together.
        let mut row0 = 0;
        let wanted: Vec<Vec<(usize, usize)>> = entries
            .iter()
            .map(|e| {
                let n = e.tokens.len();
                let rows = match e.logits {
                    Rows::None => 0..0,
                    Rows::Last => n - 1..n,
                    Rows::All => 0..n,
                };
                row0 += n;
                rows.map(|i| (row0 - n + i, e.pos + i)).collect()
            })
            .collect();
        let all: Vec<(usize, usize)> = wanted.iter().flatten().copied().collect();
        if all.is_empty() {
            self.gpu.wait()?;
        }
        let mut logits = self.read_logit_rows(&all)?.into_iter();
        Ok(wanted.iter().map(|rows| logits.by_ref().take(rows.len()).collect()).collect())
    }
}
