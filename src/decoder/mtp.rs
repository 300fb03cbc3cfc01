//! A checkpoint's MTP module on the GPU ([`crate::model::mtp`]): drafts for speculative decoding
//! from the model's own multi-token-prediction layer. Every main step keeps its rows' final-norm
//! outputs (`kept`, what the lm_head reads; a batched step's rows are its sequences' one after the
//! other); [`GpuModel::mtp_drafts`] then runs the module over one sequence's rows, each with the
//! token that followed it, at their positions: the embedding and hidden norms, `eh_proj` (its two
//! halves, the second accumulating), the module's decoder layer over its own cache layer (the
//! sequence cache's last) and routed experts (slotted like any layer's, streamed too), its head
//! norm, the model's lm_head and argmax. The draft is the last row's argmax (for a sampled
//! request, the argmax under the noise its verify row will draw with: [`DraftNoise`]); the
//! module's output row is kept as the next MTP step's hidden state, and further drafts chain on
//! the GPU, each step embedding the argmax before it.

use super::build::{BoundShared, Builder};
use super::step::Routing;
use super::*;
use crate::experts::policy::Phase;
use crate::model::mtp::MtpWeights;

/// The MTP module's kernels (see the module's doc).
pub(super) struct MtpModule {
    /// The model's spec with the MTP layer appended: the caches and expert slots count it.
    pub(super) spec: ArchSpec,
    /// The last main step's final-norm output rows (`max_batch × hidden`).
    kept: wgpu::Buffer,
    /// Hidden-state rows (`max_batch × hidden`) the module reads: a sequence's rows of `kept`,
    /// or the module's own output after an MTP step.
    hidden: wgpu::Buffer,
    embed_norm: RmsNorm,
    embed_proj: MatMul,
    hidden_norm: RmsNorm,
    hidden_proj: MatMul,
    /// The module's decoder layer (model layer `spec.layers - 1`).
    pub(super) layer: Layer,
    head_norm: RmsNorm,
    /// A sampled request's draft: the argmax of the logits over the temperature plus the noise
    /// of the key its verify row will draw with.
    noisy_argmax: Argmax,
    /// The drafts of chained MTP steps ([`MAX_DRAFTS`] token ids), read back at once.
    drafts: wgpu::Buffer,
}

/// Most drafts [`GpuModel::mtp_drafts`] chains.
pub const MAX_DRAFTS: usize = 32;

/// How a sampled request picks its tokens, for its MTP drafts: draft `j` is the token with the
/// largest logit over `temperature` plus its noise under `keys[j]`, the key the request's
/// sampler will draw the token at that position with (`Sampler::upcoming_keys`). Where module
/// and model agree under that noise, the draft is the token the verify row draws: a sampled
/// draft is accepted about as often as the two distributions overlap, not only when the
/// module's most likely token is drawn.
#[derive(Clone, Copy, Debug)]
pub struct DraftNoise<'a> {
    /// The keys of the request's next draws, one per draft.
    pub keys: &'a [u64],
    /// The request's temperature (> 0).
    pub temperature: f32,
}

/// The rows of an MTP step: tokens from the host (one row each) with the rows of the last main
/// step that hold their hidden states (from `row` on), or one row whose token is the previous
/// MTP step's argmax (a chained draft).
#[derive(Clone, Copy)]
enum MtpRows<'a> {
    Tokens { next: &'a [u32], row: usize },
    Chained,
}

impl MtpModule {
    /// Records the copy of a main step's `n` final-norm output rows (`hn`) for the module.
    pub(super) fn keep_hidden(&self, encoder: &mut wgpu::CommandEncoder, hn: &wgpu::Buffer, n: usize) {
        encoder.copy_buffer_to_buffer(hn, 0, &self.kept, 0, (n * self.spec.hidden * 4) as u64);
    }
}

impl Builder<'_> {
    /// Binds the MTP module `w` of `spec` (the model's spec with the MTP layer appended) over
    /// the model's activations.
    pub(super) fn mtp_module(
        &mut self,
        spec: ArchSpec,
        w: &MtpWeights,
        (acts, step): (&Activations, &wgpu::Buffer),
        bound: &BoundShared<'_>,
    ) -> Result<MtpModule> {
        let (h, eps) = (spec.hidden, spec.rms_eps);
        let rows = NormRows { n: h, rows_per_token: 1, at_cache_pos: false };
        let kept = self.gpu.storage("mtp kept rows", (self.options.max_batch * h * 4) as u64);
        let hidden = self.gpu.storage("mtp hidden", (self.options.max_batch * h * 4) as u64);
        let embed_norm = self.norm(&w.embed_norm, &acts.x, Some(&acts.hn), rows, eps);
        let embed_proj = self.matmul("mtp eh_proj", &w.embed_proj, None, &acts.hn, &acts.x, MatMulOut::plain(h))?;
        let hidden_norm = self.norm(&w.hidden_norm, &hidden, Some(&acts.hn), rows, eps);
        let add = MatMulOut { accumulate: true, ..MatMulOut::plain(h) };
        let hidden_proj = self.matmul("mtp eh_proj", &w.hidden_proj, None, &acts.hn, &acts.x, add)?;
        let i = spec.layers - 1;
        self.layer = Some(i);
        let (layer, pending) = self.decoder_layer(&spec, i, &w.layer, acts, bound, None)?;
        self.layer = None;
        let head_norm = match pending {
            Some(top_k) => self.norm_after_combine(&w.head_norm, acts, top_k, eps),
            None => self.norm(&w.head_norm, &acts.x, Some(&acts.hn), rows, eps),
        };
        let drafts = self.gpu.storage("mtp drafts", (MAX_DRAFTS * 4) as u64);
        let noisy_argmax = Argmax::with_noise(self.gpu, step, &acts.logits, &acts.argmax, spec.vocab);
        Ok(MtpModule {
            spec,
            kept,
            hidden,
            embed_norm,
            embed_proj,
            hidden_norm,
            hidden_proj,
            layer,
            head_norm,
            noisy_argmax,
            drafts,
        })
    }
}

impl GpuModel {
    /// Whether the model runs its MTP module ([`DecoderOptions::mtp`]).
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Runs the MTP module at positions `pos..pos + next.len()` of `cache` (row i reads the
    /// hidden state the last main step left in its row `row + i`, that of position `pos + i`
    /// — a step of this sequence alone has it in row `i` —, with `next[i]`, the token after
    /// that position), then `count - 1` more MTP steps chained on the
    /// GPU, each at the next position on the module's own output and the draft before (no round
    /// trip between them): the `count` drafts for the positions after the last row's next token
    /// (greedy tokens, or under `noise` for a sampled request: at most one per key), read back
    /// once. With `count` 0 the module only runs over the rows (their drafts unread, nothing
    /// waited for: a prefill chunk's).
    pub fn mtp_drafts(
        &self,
        cache: &SequenceCache,
        (next, row): (&[u32], usize),
        pos: usize,
        count: usize,
        noise: Option<DraftNoise<'_>>,
        phase: Phase,
    ) -> Result<Vec<u32>> {
        let count = noise.map_or(count, |n| count.min(n.keys.len()));
        let gpu = &*self.gpu;
        let n = next.len();
        if pos + n - 1 + count > self.options.context {
            return Err(Error::ContextOverflow { requested: pos + n - 1 + count, context: self.options.context });
        }
        if count > MAX_DRAFTS {
            return Err(Error::InvalidArgument(format!("{count} MTP drafts (at most {MAX_DRAFTS})")));
        }
        for j in 0..count.max(1) {
            let (rows, at) = match j {
                0 => (MtpRows::Tokens { next, row }, pos),
                _ => (MtpRows::Chained, pos + n - 1 + j),
            };
            let mut rec = self.record_mtp(cache, rows, at, phase)?;
            if count > 0 {
                let mtp = self.mtp.as_ref().expect("record_mtp checked it");
                match noise {
                    Some(n) => {
                        // Written before this submission, after the previous one's.
                        mtp.noisy_argmax.set_noise(gpu, n.keys[j], n.temperature);
                        mtp.noisy_argmax.record(gpu, &mut rec);
                    }
                    None => self.argmax.record(gpu, &mut rec),
                }
                rec.encoder().copy_buffer_to_buffer(&self.acts.argmax, 0, &mtp.drafts, 4 * j as u64, 4);
            }
            rec.submit(&gpu.queue);
        }
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut ids = vec![0u32; count];
        let drafts = &self.mtp.as_ref().expect("record_mtp checked it").drafts;
        self.readback.read(gpu, drafts, 0, bytemuck::cast_slice_mut(&mut ids))?;
        ids.iter().enumerate().map(|(j, &id)| Self::greedy_token(id, pos + n - 1 + j)).collect()
    }

    /// The MTP module's logits after the last of the rows [`GpuModel::mtp_drafts`] runs (one
    /// MTP step, nothing chained) after a main step of this sequence alone.
    pub fn mtp_logits(&self, cache: &SequenceCache, next: &[u32], pos: usize, phase: Phase) -> Result<Vec<f32>> {
        let n = next.len();
        self.record_mtp(cache, MtpRows::Tokens { next, row: 0 }, pos, phase)?.submit(&self.gpu.queue);
        Ok(self.read_logit_rows(&[(n - 1, pos + n - 1)])?.pop().expect("one row asked for"))
    }

    /// Records an MTP step of `rows` at `pos` (see [`GpuModel::mtp_drafts`]) up to the last
    /// row's logits; the parts that stream experts are submitted on the way.
    fn record_mtp(&self, cache: &SequenceCache, rows: MtpRows<'_>, pos: usize, phase: Phase) -> Result<Pass> {
        let mtp = self.mtp.as_ref().ok_or_else(|| {
            Error::InvalidArgument("the model was loaded without its MTP module (DecoderOptions::mtp)".into())
        })?;
        let gpu = &*self.gpu;
        let row_bytes = (self.spec.hidden * 4) as u64;
        let mut rec = Pass::new(&gpu.device);
        let (n, embed) = match rows {
            MtpRows::Tokens { next, row } => {
                self.check_step(cache, next, next.len(), pos)?;
                if row + next.len() > self.options.max_batch {
                    return Err(Error::InvalidArgument(format!(
                        "MTP rows {row}..{} of a step of at most {}",
                        row + next.len(),
                        self.options.max_batch
                    )));
                }
                gpu.queue.write_buffer(&self.acts.tokens, 0, bytemuck::cast_slice(next));
                let bytes = next.len() as u64 * row_bytes;
                rec.encoder().copy_buffer_to_buffer(&mtp.kept, row as u64 * row_bytes, &mtp.hidden, 0, bytes);
                (next.len(), &self.embed)
            }
            MtpRows::Chained => {
                self.check_step(cache, &[], 1, pos)?;
                (1, &self.embed_from_argmax)
            }
        };
        self.step.set(gpu, n, pos);
        // The argmax will no longer hold a chained step's token.
        *self.chain.argmax_of.lock().expect("chain lock") = None;
        embed.record(gpu, &mut rec, n);
        mtp.embed_norm.record(gpu, &mut rec, n);
        mtp.embed_proj.record(gpu, &mut rec, n);
        mtp.hidden_norm.record(gpu, &mut rec, n);
        mtp.hidden_proj.record(gpu, &mut rec, n);
        let (l, i) = (&mtp.layer, mtp.spec.layers - 1);
        l.attn_norm.record(gpu, &mut rec, n);
        l.attn.record_inputs(gpu, &mut rec, n);
        self.record_attention_of(&l.attn, cache, i, &mut rec, n, pos + n);
        l.attn.record_output(gpu, &mut rec, n);
        let mut residency = self.residency();
        if let Some(r) = residency.as_deref_mut() {
            r.begin_step(phase, n);
        }
        let mut routing = Routing::PerLayer { all_hit: true, known: Vec::new() };
        let moe_index = self.moe_layers.len();
        rec = self.record_ffn(rec, l, (i, moe_index), n, residency.as_deref_mut(), &mut routing, &mut None)?;
        if let Some(r) = residency.as_deref_mut() {
            r.end_step()?;
        }
        drop(residency);
        mtp.head_norm.record(gpu, &mut rec, n);
        // The module's output of its last row: the hidden state of a chained MTP step.
        rec.encoder().copy_buffer_to_buffer(&self.acts.x, (n as u64 - 1) * row_bytes, &mtp.hidden, 0, row_bytes);
        self.lm_head_last.record(gpu, &mut rec, n);
        Ok(rec)
    }
}
