//! Verifying draft tokens: a step of a decode token and the tokens drafted after it returns
//! every token's logits, and can then be cut back to the tokens the verification accepted. The
//! grouped and MLA caches need nothing for that (rows past the kept positions are written again
//! before any attention reads them); linear-attention states, which hold the whole step, are
//! kept token by token in steps of up to `TOKEN_STATE_ROWS` tokens and the last kept token's
//! put back (`super::draft_states`); a longer step's are copied aside before it
//! (`super::state_copy`), put back and run again over the kept tokens.

use super::step::{Routing, Sequences, TokenSource};
use super::{GpuModel, SequenceCache, StepOutput, StepResult};
use crate::error::Result;
use crate::experts::policy::Phase;
use crate::gpu::Pass;

impl GpuModel {
    /// Runs `tokens` (a decode token and the drafts after it) at positions `pos..` of `cache`
    /// and returns the logits after each; linear-attention states are saved first, so that
    /// [`GpuModel::keep_drafted`] can cut the step back.
    pub fn step_drafted(&self, cache: &SequenceCache, tokens: &[u32], pos: usize) -> Result<Vec<Vec<f32>>> {
        let n = tokens.len();
        self.check_step(cache, tokens, n, pos)?;
        let gpu = &*self.gpu;
        gpu.queue.write_buffer(&self.acts.tokens, 0, bytemuck::cast_slice(tokens));
        let mut rec = Pass::new(&gpu.device);
        self.prepare_drafted_step(cache, n, Some(rec.encoder()))?;
        let mut routing = Routing::PerLayer { all_hit: true, known: Vec::new() };
        let one = Sequences::One { cache, pos };
        let rec =
            self.record_step(rec, one, n, Phase::Decode, StepOutput::AllLogits, TokenSource::Host, &mut routing)?;
        rec.submit(&gpu.queue);
        let rows = match self.collect(n, pos, StepOutput::AllLogits)? {
            StepResult::AllLogits(rows) => rows,
            _ => unreachable!("collect answers what was asked"),
        };
        cache.end_step(pos + n);
        self.finish_step(n, pos + n)?;
        Ok(rows)
    }

    /// Prepares `cache` (nothing without linear-attention states) for a batched step
    /// ([`GpuModel::step_batch`]) that runs `rows` tokens on it, a decode token and drafts, so
    /// that [`GpuModel::keep_drafted`] can cut that step back.
    pub fn prepare_for_drafts(&self, cache: &SequenceCache, rows: usize) -> Result<()> {
        self.prepare_drafted_step(cache, rows, None)
    }

    /// Keeps only the first `kept` (at least 1) of the `tokens` that [`GpuModel::step_drafted`]
    /// (or a batched step after [`GpuModel::prepare_for_drafts`]) just ran at `pos` on `cache`:
    /// linear-attention states become the last kept token's (kept per token), or go back to
    /// before that step and run the kept tokens again; other caches need nothing.
    pub fn keep_drafted(&self, cache: &SequenceCache, tokens: &[u32], pos: usize, kept: usize) -> Result<()> {
        if !cache.has_linear_state() || self.keep_token_states(cache, pos, (kept, tokens.len())) {
            return Ok(());
        }
        if kept >= tokens.len() {
            return Ok(());
        }
        let gpu = &*self.gpu;
        let mut encoder = gpu.device.create_command_encoder(&Default::default());
        cache.restore_linear_state(&mut encoder);
        gpu.queue.submit([encoder.finish()]);
        cache.end_step(pos);
        if kept > 0 {
            self.step(cache, &tokens[..kept], pos, Phase::Decode, StepOutput::None)?;
        }
        Ok(())
    }
}
