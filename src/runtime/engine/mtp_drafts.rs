//! The model's MTP module in the engine: whether it is loaded ([`mtp_to_load`]), and drafts from it
//! for `generate` and the scheduler ([`GenerateOptions::mtp_drafts`]). The module runs over every
//! position the main model runs, one step behind: a main step leaves its rows' hidden states (a
//! batched step, each sequence's at its own rows), and once the tokens after those positions are
//! known (the next prefill chunk's, the sampled token, the accepted drafts and the token after
//! them) the module runs over them, its last row proposing the token after the sequence's end;
//! further drafts chain the module on its own output. A step that does not draft (paced:
//! `DraftPacing`) skips the module: running it anyway, to leave no position of its cache unwritten
//! for later drafts to attend over, cost the README's first command (sampled, where drafting mostly
//! pauses on lavapipe) a quarter of its decode speed. Verification keeps the output exactly the
//! plain one, as with prompt-lookup drafts.

use super::generation::Picker;
use super::Engine;
use crate::decoder::{DraftNoise, MAX_MTP_DRAFTS};
use crate::error::{Error, Result};
use crate::experts::policy::Phase;
use crate::model::ArchSpec;
use crate::runtime::options::{GenerateOptions, MtpLoad};
use crate::runtime::session::Session;

/// The model's spec with the MTP layer appended where `load` asks for the module and `found`
/// gives it (else why not): none with `Off`; with `Required`, why not is the error; with
/// `Available`, the engine loads without the module and the log says why.
pub(super) fn mtp_to_load(load: MtpLoad, found: impl FnOnce() -> Result<ArchSpec>) -> Result<Option<ArchSpec>> {
    match load {
        MtpLoad::Off => Ok(None),
        MtpLoad::Required => found().map(Some),
        MtpLoad::Available => Ok(found().inspect_err(|e| log::info!("loading without an MTP module: {e}")).ok()),
    }
}

/// Where a request's MTP module stands: the first position whose main-step row it has not run,
/// and the row of the last main step on the sequence that holds that position's hidden state.
#[derive(Clone, Copy, Debug)]
pub(super) struct MtpDrafts {
    behind: usize,
    row: usize,
}

impl MtpDrafts {
    /// Refuses MTP drafts of sizes out of range, or on an engine loaded without the module
    /// (with a constraint: `validate_drafts`).
    pub(super) fn validate(engine: &Engine, options: &GenerateOptions) -> Result<()> {
        match options.mtp_drafts {
            0 => Ok(()),
            n if n > MAX_MTP_DRAFTS => {
                Err(Error::InvalidArgument(format!("draft length {n} must be in 1..={MAX_MTP_DRAFTS}")))
            }
            _ if !engine.model.has_mtp() => Err(Error::InvalidArgument(
                "MTP drafts need the model's MTP module, which this engine did not load (EngineOptions::mtp)".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Leaves the main model's rows before `pos` unrun (a step that does not draft: the
    /// module's cache keeps what it held at those positions, which only its later drafts read).
    /// The next main step runs from `pos`, alone (row 0) unless [`MtpDrafts::after_step`] says
    /// otherwise.
    pub(super) fn skip_to(&mut self, pos: usize) {
        (self.behind, self.row) = (pos, 0);
    }

    /// A request whose last main step ran positions `from..` (its last prefill chunk, or the
    /// decode token and drafts of a batched step) from that step's row `row`, and whose module
    /// has run every position before.
    pub(super) fn after_step(from: usize, row: usize) -> MtpDrafts {
        MtpDrafts { behind: from, row }
    }

    /// Runs the module over the main model's rows from where it is behind up to `pos` (the
    /// sequence's last token, not yet run by the main model; the tokens after those rows are
    /// all known now) and, with `want` above 0, returns up to `want` drafts for the positions
    /// after `pos`, as `picker` will pick them: greedy, or sampled under the noise of its next
    /// draws. The next main step runs from `pos`, alone (row 0) unless [`MtpDrafts::after_step`]
    /// says otherwise.
    pub(super) fn catch_up(
        &mut self,
        engine: &Engine,
        session: &Session,
        (pos, want): (usize, usize),
        picker: &Picker,
    ) -> Result<Vec<u32>> {
        let (from, row) = (self.behind, self.row);
        if from >= pos {
            return Ok(Vec::new());
        }
        self.skip_to(pos);
        // Further drafts chain the module on its own output, on the GPU.
        let sampled = picker.upcoming_noise(want);
        let noise = sampled.as_ref().map(|(keys, temperature)| DraftNoise { keys, temperature: *temperature });
        let next = (&session.tokens[from + 1..=pos], row);
        engine.model.mtp_drafts(&session.cache, next, from, want, noise, Phase::Decode)
    }
}

impl Engine {
    /// Runs the MTP module over prefill chunk `start..end` of `session`, whose hidden states
    /// the last main step left from its row `row`, where the next tokens (`start + 1..=end`)
    /// are known: every chunk but the last.
    pub(super) fn mtp_over_chunk(&self, session: &Session, (start, end): (usize, usize), row: usize) -> Result<()> {
        if end < session.tokens.len() {
            // Its drafts are not wanted: nothing is waited for.
            let next = &session.tokens[start + 1..=end];
            self.model.mtp_drafts(&session.cache, (next, row), start, 0, None, Phase::Prefill)?;
        }
        Ok(())
    }
}
