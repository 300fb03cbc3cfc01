//! Chained greedy decode: a one-token step whose token is the greedy token of the step
//! submitted before it, still on the GPU. The next step is submitted before this one's token is
//! read back, so the GPU does not sit idle while the host waits for a token, looks at it and
//! records the next step (mlx-lm's asynchronous evaluation does the same). Only for steps that
//! are one submission and leave nothing for the host between steps: every expert resident (no
//! streaming, no trace, no observer), no prerouter, no profiler, and no linear-attention state
//! (which a step past the reply's end could not roll back).

use std::sync::Mutex;

use super::step::{Routing, TokenSource};
use super::{Attn, GpuModel, SequenceCache, StepOutput};
use crate::error::{Error, Result};
use crate::experts::policy::Phase;
use crate::gpu::{Gpu, Pass, PendingRead, Readback};

/// The staging buffers chained steps read their tokens through: two, so that one step can be
/// read while the next is in flight.
pub(super) struct ChainStaging {
    buffers: [Readback; 2],
    in_flight: Mutex<[bool; 2]>,
    /// The sequence and position whose greedy token `acts.argmax` holds (the last step of that
    /// sequence asked for it and ended there).
    pub(super) argmax_of: Mutex<Option<(u64, usize)>>,
}

impl ChainStaging {
    pub(super) fn new(gpu: &Gpu) -> Self {
        ChainStaging {
            buffers: [Readback::new(gpu, 4), Readback::new(gpu, 4)],
            in_flight: Mutex::new([false; 2]),
            argmax_of: Mutex::new(None),
        }
    }
}

/// A chained step, submitted ([`GpuModel::submit_chained`]) and not yet read. Dropped unread,
/// it waits for the GPU to finish it and discards its token.
pub struct ChainedStep<'a> {
    model: &'a GpuModel,
    pos: usize,
    staging: usize,
    submission: wgpu::SubmissionIndex,
    read: Option<PendingRead<'a>>,
}

impl GpuModel {
    /// Whether one-token greedy steps can be chained (see the module docs); when not,
    /// [`GpuModel::step`] runs them one at a time.
    pub fn can_chain(&self) -> bool {
        !self.layers.iter().any(|l| matches!(l.attn, Attn::Linear(_)))
            && self.prerouter.is_none()
            && self.gpu.profiler().is_none()
            && self.observer.lock().expect("observer lock").is_none()
            && self.residency().is_none_or(|r| !r.needs_routing())
    }

    /// Submits a one-token decode step at `pos` of `cache` without waiting for it, producing
    /// the greedy next token. Its token is `token`, or with `None` the greedy token of the
    /// step on this sequence that ended at `pos` (submitted, perhaps not yet finished). At most
    /// two chained steps may be in flight.
    pub fn submit_chained(&self, cache: &SequenceCache, token: Option<u32>, pos: usize) -> Result<ChainedStep<'_>> {
        if !self.can_chain() {
            return Err(Error::InvalidArgument("this model's steps cannot be chained".into()));
        }
        self.check_step(cache, token.as_slice(), 1, pos)?;
        let gpu = &*self.gpu;
        let source = match token {
            Some(t) => {
                gpu.queue.write_buffer(&self.acts.tokens, 0, bytemuck::bytes_of(&t));
                TokenSource::Host
            }
            None if *self.chain.argmax_of.lock().expect("chain lock") == Some((cache.id(), pos)) => {
                TokenSource::PreviousArgmax
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "no greedy token of this sequence's position {pos} is on the GPU to chain from"
                )))
            }
        };
        let staging = {
            let mut in_flight = self.chain.in_flight.lock().expect("chain lock");
            let free = in_flight
                .iter()
                .position(|busy| !busy)
                .ok_or_else(|| Error::InvalidArgument("two chained steps are already in flight".into()))?;
            in_flight[free] = true;
            free
        };
        let buffer = &self.chain.buffers[staging];
        let rec = Pass::new(&gpu.device);
        let recorded = self
            .record_step(
                rec,
                super::step::Sequences::One { cache, pos },
                1,
                Phase::Decode,
                StepOutput::Argmax,
                source,
                &mut Routing::PerLayer { all_hit: true, known: Vec::new() },
            )
            .and_then(|mut rec| {
                buffer.record_copy(rec.encoder(), &self.acts.argmax, 0, 4)?;
                Ok(rec)
            });
        let rec = match recorded {
            Ok(rec) => rec,
            Err(e) => {
                self.chain.in_flight.lock().expect("chain lock")[staging] = false;
                return Err(e);
            }
        };
        let submission = rec.submit(&gpu.queue);
        Ok(ChainedStep { model: self, pos, staging, submission, read: Some(buffer.map(4)) })
    }
}

impl ChainedStep<'_> {
    /// The position of the step's token.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Waits for the step and returns its greedy token; NaN or infinite logits are
    /// [`Error::NonFiniteOutput`].
    pub fn finish(mut self) -> Result<u32> {
        self.wait()
    }

    fn wait(&mut self) -> Result<u32> {
        let read = self.read.take().expect("a chained step is read once");
        let mut id = [0u8; 4];
        let done = read.finish(&self.model.gpu, Some(self.submission.clone()), &mut id);
        self.model.chain.in_flight.lock().expect("chain lock")[self.staging] = false;
        done?;
        GpuModel::greedy_token(u32::from_le_bytes(id), self.pos)
    }
}

impl Drop for ChainedStep<'_> {
    fn drop(&mut self) {
        if self.read.is_some() {
            // Its token is not wanted; the staging buffer must be unmapped before it is reused.
            let _ = self.wait();
        }
    }
}
