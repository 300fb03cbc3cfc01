//! Each token's linear-attention states in a step of draft tokens, so that a verification that
//! keeps only some of them cuts the step back by copying the last kept token's states (the
//! grouped and MLA caches need nothing: rows past the kept positions are written again before
//! anything reads them). A step of up to [`TOKEN_STATE_ROWS`] tokens on a hybrid model runs its
//! conv and delta rule token by token (the form decode steps take) with kernels that also write
//! the conv window and recurrent state after every token into per-token copies, made at the
//! sequence's first such step from the KV budget. Longer drafted steps save the states before
//! and run the kept tokens again (`super::state_copy`), as every drafted step did before.

use std::sync::atomic::Ordering;

use super::cache::{LayerCache, SequenceCache};
use super::{Attn, GpuModel};
use crate::error::Result;
use crate::gpu::context::counting_allocations;
use crate::gpu::{Gpu, Pass};
use crate::ops::causal_conv1d::CausalConv1d;
use crate::ops::gated_delta_rule::GatedDeltaRule;

/// Most tokens of a drafted step whose states are kept token by token: a decode token and up
/// to four drafts (the CLI's defaults: 3 from an MTP module, 4 by prompt lookup); more, and the
/// step saves the states and runs the kept tokens again. The per-token copies take this many
/// times a sequence's linear-attention states (Qwen3.6-35B-A3B: ~5 × 63 MiB).
pub const TOKEN_STATE_ROWS: usize = 5;

/// One linear layer's per-token states of a drafted step and the kernels that write them.
pub(super) struct DraftStates {
    conv: CausalConv1d,
    delta: GatedDeltaRule,
    /// The conv window after each token, `[TOKEN_STATE_ROWS, conv_dim, kernel - 1]`.
    windows: wgpu::Buffer,
    /// The recurrent state after each token, `[TOKEN_STATE_ROWS, v_heads, dk, dv]`.
    states: wgpu::Buffer,
}

impl DraftStates {
    /// Records the conv and the delta rule over a step of `n` tokens, keeping each one's states.
    pub(super) fn record(&self, gpu: &Gpu, pass: &mut Pass, n: usize) {
        self.conv.record(gpu, pass);
        self.delta.record(gpu, pass, n);
    }
}

impl SequenceCache {
    /// Whether a step of `n` tokens now keeps each token's linear-attention states (armed by
    /// [`GpuModel::prepare_drafted_step`]).
    pub(super) fn keeps_token_states(&self, n: usize) -> bool {
        n <= TOKEN_STATE_ROWS && self.draft_states_armed.load(Ordering::Acquire)
    }
}

impl GpuModel {
    /// Prepares `cache` for a step of `rows` tokens, a decode token and drafts, that
    /// [`GpuModel::keep_drafted`] may cut back: on a hybrid model, up to [`TOKEN_STATE_ROWS`]
    /// rows keep each token's states (the per-token copies made at the first such step), more
    /// save the states first (`encoder`, else submitted now).
    pub(super) fn prepare_drafted_step(
        &self,
        cache: &SequenceCache,
        rows: usize,
        encoder: Option<&mut wgpu::CommandEncoder>,
    ) -> Result<()> {
        if !cache.has_linear_state() {
            return Ok(());
        }
        if rows <= TOKEN_STATE_ROWS {
            // Where the KV budget cannot hold the per-token copies, the states are saved instead.
            match self.ensure_draft_states(cache) {
                Ok(()) => {
                    cache.draft_states_armed.store(true, Ordering::Release);
                    return Ok(());
                }
                Err(e) => log::debug!("drafted step without per-token states: {e}"),
            }
        }
        cache.draft_states_armed.store(false, Ordering::Release);
        cache.ensure_state_copies()?;
        match encoder {
            Some(e) => cache.save_linear_state(e),
            None => {
                let mut e = self.gpu.device.create_command_encoder(&Default::default());
                cache.save_linear_state(&mut e);
                self.gpu.queue.submit([e.finish()]);
            }
        }
        Ok(())
    }

    /// Cuts a drafted step of `rows` tokens at `pos` that kept each token's states back to its
    /// first `kept` tokens (the states after token `kept - 1` become the sequence's, which then
    /// holds `pos + kept` positions); `false` when the step did not keep them.
    pub(super) fn keep_token_states(&self, cache: &SequenceCache, pos: usize, (kept, rows): (usize, usize)) -> bool {
        if !cache.draft_states_armed.swap(false, Ordering::AcqRel) {
            return false;
        }
        if kept >= rows {
            return true;
        }
        let bytes = self.token_state_bytes();
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        for l in &cache.layers {
            let LayerCache::Linear(c) = l else { continue };
            let d = c.draft.get().expect("armed after the per-token copies were made");
            for ((live, copies), size) in [(&c.window, &d.windows), (&c.state, &d.states)].into_iter().zip(bytes) {
                encoder.copy_buffer_to_buffer(copies, (kept as u64 - 1) * size, live, 0, size);
            }
        }
        self.gpu.queue.submit([encoder.finish()]);
        cache.end_step(pos + kept);
        true
    }

    /// Bytes of one linear layer's conv window and recurrent state (as the kernels lay them out
    /// per token).
    fn token_state_bytes(&self) -> [u64; 2] {
        let hy = self.spec.hybrid.as_ref().expect("linear layers belong to a hybrid model");
        let window = hy.conv_dim() * (hy.conv_kernel - 1);
        [window as u64 * 4, (hy.num_v_heads * hy.head_k_dim * hy.head_v_dim * 4) as u64]
    }

    /// Gives `cache`'s linear layers their per-token copies and kernels unless they have them,
    /// all or none, reserving the bytes from the KV budget.
    fn ensure_draft_states(&self, cache: &SequenceCache) -> Result<()> {
        let hy = self.spec.hybrid.as_ref().expect("linear layers belong to a hybrid model");
        let missing: Vec<usize> = (cache.layers.iter().enumerate())
            .filter(|(_, l)| matches!(l, LayerCache::Linear(c) if c.draft.get().is_none()))
            .map(|(i, _)| i)
            .collect();
        let [window, state] = self.token_state_bytes().map(|b| TOKEN_STATE_ROWS as u64 * b);
        // Buffers are allocated in multiples of 16 bytes.
        let per_layer = window.next_multiple_of(16) + state.next_multiple_of(16);
        cache.ledger.reserve(per_layer * missing.len() as u64)?;
        for i in missing {
            let (LayerCache::Linear(c), Attn::Linear(a)) = (&cache.layers[i], &self.layers[i].attn) else {
                unreachable!("a linear cache's layer is linear")
            };
            let gpu = &self.gpu;
            let ((windows, states), allocated) = counting_allocations(|| {
                (gpu.storage("per-token conv windows", window), gpu.storage("per-token recurrent states", state))
            });
            debug_assert_eq!(allocated, per_layer);
            cache.bytes.fetch_add(per_layer, Ordering::AcqRel);
            let (conv, delta) = self.linear_kernels(hy, a, (&c.window, &c.state), Some((&windows, &states)));
            let _ = c.draft.set(Box::new(DraftStates { conv, delta, windows, states }));
        }
        Ok(())
    }
}
