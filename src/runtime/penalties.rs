//! Penalties on tokens the context already holds, applied to the logits before a token is
//! chosen: llama.cpp's repetition penalty (a positive logit divided by it, a negative one
//! multiplied) and OpenAI's presence and frequency penalties (`count * frequency + presence`
//! subtracted), all over the last `last_n` tokens of the sequence.

/// Which penalties apply; [`Penalties::default`] is none.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    /// Repetition penalty (1 = off; llama.cpp's `--repeat-penalty`).
    pub repeat: f32,
    /// Tokens of the sequence looked back over (llama.cpp's `--repeat-last-n`).
    pub last_n: usize,
    /// Subtracted once from the logit of every token present (OpenAI's `presence_penalty`).
    pub presence: f32,
    /// Subtracted per occurrence (OpenAI's `frequency_penalty`).
    pub frequency: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Penalties { repeat: 1.0, last_n: 64, presence: 0.0, frequency: 0.0 }
    }
}

impl Penalties {
    /// Whether any penalty changes a logit.
    pub fn active(&self) -> bool {
        self.last_n > 0 && (self.repeat != 1.0 || self.presence != 0.0 || self.frequency != 0.0)
    }

    /// Refuses values that would penalise silently wrong: a repetition penalty that is not a
    /// number > 0, presence or frequency penalties outside [-2, 2] (OpenAI's range).
    pub fn validate(&self) -> crate::Result<()> {
        if !(self.repeat.is_finite() && self.repeat > 0.0) {
            return Err(crate::Error::InvalidArgument(format!(
                "repeat penalty {} is not a number > 0 (1 is off)",
                self.repeat
            )));
        }
        for (name, v) in [("presence penalty", self.presence), ("frequency penalty", self.frequency)] {
            if !(-2.0..=2.0).contains(&v) {
                return Err(crate::Error::InvalidArgument(format!("{name} {v} is not in [-2, 2]")));
            }
        }
        Ok(())
    }

    /// Applies the penalties to `logits` for the tokens among the last `last_n` of `history`;
    /// `window` is scratch space the caller keeps between tokens (no allocation per token).
    pub fn apply(&self, logits: &mut [f32], history: &[u32], window: &mut Vec<u32>) {
        window.clear();
        window.extend_from_slice(&history[history.len().saturating_sub(self.last_n)..]);
        window.sort_unstable();
        for run in window.chunk_by(|a, b| a == b) {
            let Some(l) = logits.get_mut(run[0] as usize) else { continue };
            *l = if *l > 0.0 { *l / self.repeat } else { *l * self.repeat };
            *l -= run.len() as f32 * self.frequency + self.presence;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Penalties;

    #[test]
    fn penalties_follow_llama_cpp_and_openai() {
        let p = Penalties { repeat: 2.0, last_n: 3, presence: 0.5, frequency: 0.25 };
        let mut logits = [4.0, -4.0, 4.0, 1.0];
        // Token 0 falls outside the last three; 1 appears twice, 3 once.
        p.apply(&mut logits, &[0, 1, 1, 3], &mut Vec::new());
        assert_eq!(logits, [4.0, -8.0 - 0.5 - 0.5, 4.0, 0.5 - 0.25 - 0.5]);
        assert!(!Penalties::default().active());
        assert!(Penalties { repeat: 0.0, ..p }.validate().is_err());
        assert!(Penalties { presence: 3.0, ..p }.validate().is_err());
        assert!(p.validate().is_ok());
    }
}
