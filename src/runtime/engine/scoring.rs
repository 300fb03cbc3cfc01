//! Teacher-forced scoring and the next token's distribution on an [`Engine`]: the default
//! session or a caller's [`Session`], only what the session's cache does not hold run.

use serde::Serialize;

use super::Engine;
use crate::decoder::{RoutingMode, StepOutput, StepResult};
use crate::error::{Error, Result};
use crate::experts::policy::Phase;
use crate::experts::residency::ExpertStats;
use crate::runtime::session::Session;

/// Teacher-forced scores of a sequence.
#[derive(Clone, Debug, Serialize)]
pub struct Score {
    /// The sequence.
    pub tokens: Vec<u32>,
    /// `log p(tokens[i+1] | tokens[..=i])`, n-1 values.
    pub logprobs: Vec<f32>,
    /// `exp(-mean(logprobs))`.
    pub perplexity: f64,
    /// Expert-cache figures of the scoring pass.
    pub experts: ExpertStats,
}

impl Engine {
    /// Teacher-forces `tokens` and returns the log-probability of each next token.
    pub fn score(&self, tokens: &[u32]) -> Result<Score> {
        self.check_prompt(tokens)?;
        if tokens.len() < 2 {
            return Err(Error::InvalidArgument("scoring needs at least 2 tokens".into()));
        }
        self.with_default_session(|session| self.score_in(session, tokens))
    }

    /// Appends `new_tokens` to `session` and teacher-forces them: `log p(t | all before t)` for
    /// each new token that has a token before it in the session. The positions the session's
    /// cache holds are not recomputed (but for the last one before the new tokens, whose
    /// logits score the first); the last new token's own position is left to the next call.
    pub fn score_in(&self, session: &mut Session, new_tokens: &[u32]) -> Result<Score> {
        self.check_owner(session)?;
        self.check_tokens(new_tokens, session.len())?;
        let start = session.len().saturating_sub(1);
        session.tokens.extend_from_slice(new_tokens);
        let before = self.begin_request()?;
        let scored = self.score_from(session, start);
        let experts = self.end_request(before);
        let logprobs = scored?;
        let mean = logprobs.iter().map(|&l| l as f64).sum::<f64>() / logprobs.len().max(1) as f64;
        Ok(Score { tokens: new_tokens.to_vec(), logprobs, perplexity: (-mean).exp(), experts })
    }

    /// Runs `session`'s positions `start..len-1`, returning the log-probability of each next
    /// token (after bringing the cache up to `start`).
    fn score_from(&self, session: &mut Session, start: usize) -> Result<Vec<f32>> {
        // Predicted routing applies to one-token steps only: each token's routing is the
        // prediction made after the token before.
        let b = if self.routing == RoutingMode::Predicted { 1 } else { self.model.options().max_batch };
        let len = session.len();
        let mut logprobs = Vec::with_capacity(len.saturating_sub(start + 1));
        session.cached = session.cache.resume_point(session.cached.min(start));
        while session.cached < start {
            let (from, to) = (session.cached, (session.cached + b).min(start));
            self.model.step(&session.cache, &session.tokens[from..to], from, Phase::Prefill, StepOutput::None)?;
            session.cached = to;
        }
        session.cached = start;
        for from in (start..len.saturating_sub(1)).step_by(b) {
            let to = (from + b).min(len - 1);
            let targets = &session.tokens[from + 1..to + 1];
            let output = StepOutput::LogProbs(targets);
            match self.model.step(&session.cache, &session.tokens[from..to], from, Phase::Prefill, output)? {
                StepResult::LogProbs(lp) => logprobs.extend(lp),
                _ => unreachable!("scoring asks for log-probs"),
            }
            session.cached = to;
        }
        Ok(logprobs)
    }

    /// Appends `new_tokens` to `session` and returns the log-softmax of the logits after its
    /// whole sequence (the distribution of the next token), prefilling only what its cache does
    /// not hold.
    pub fn next_logprobs_in(&self, session: &mut Session, new_tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_owner(session)?;
        if session.is_empty() && new_tokens.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        self.check_tokens(new_tokens, session.len())?;
        session.tokens.extend_from_slice(new_tokens);
        let before = self.begin_request()?;
        let result = self.prefill(session, StepOutput::Logits, false);
        self.end_request(before);
        match result?.0 {
            StepResult::Logits(l) => Ok(log_softmax(&l)),
            _ => unreachable!("asked for logits"),
        }
    }

    /// Log-softmax of the logits after `tokens` (the distribution of the next token).
    pub fn next_logprobs(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_prompt(tokens)?;
        self.with_default_session(|session| self.next_logprobs_in(session, tokens))
    }
}

/// `l - logsumexp(l)`.
fn log_softmax(l: &[f32]) -> Vec<f32> {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = max + l.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
    l.iter().map(|v| v - lse).collect()
}
