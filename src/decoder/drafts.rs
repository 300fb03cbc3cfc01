//! Verifying draft tokens: a step of a decode token and the tokens drafted after it returns
//! every token's logits, and can then be cut back to the tokens the verification accepted. The
//! grouped and MLA caches need nothing for that (rows past the kept positions are written again
//! before any attention reads them); linear-attention states, which hold the whole step, are
//! copied aside before it (into copies made at the first such step, `super::state_copy`), put
//! back and run again over the kept tokens.

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
        cache.ensure_state_copies()?;
        gpu.queue.write_buffer(&self.acts.tokens, 0, bytemuck::cast_slice(tokens));
        let mut rec = Pass::new(&gpu.device);
        cache.save_linear_state(rec.encoder());
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

    /// Saves `cache`'s linear-attention states (nothing without them) before a batched step
    /// ([`GpuModel::step_batch`]) runs drafts on it, so that [`GpuModel::keep_drafted`] can cut
    /// that step back.
    pub fn save_states_for_drafts(&self, cache: &SequenceCache) -> Result<()> {
        if !cache.has_linear_state() {
            return Ok(());
        }
        cache.ensure_state_copies()?;
        let mut encoder = self.gpu.device.create_command_encoder(&Default::default());
        cache.save_linear_state(&mut encoder);
        self.gpu.queue.submit([encoder.finish()]);
        Ok(())
    }

    /// Keeps only the first `kept` of the `tokens` that [`GpuModel::step_drafted`] (or a batched
    /// step after [`GpuModel::save_states_for_drafts`]) just ran at
    /// `pos` on `cache`: linear-attention states go back to before that step and run the kept
    /// tokens again; other caches need nothing.
    pub fn keep_drafted(&self, cache: &SequenceCache, tokens: &[u32], pos: usize, kept: usize) -> Result<()> {
        if kept >= tokens.len() || !cache.has_linear_state() {
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
