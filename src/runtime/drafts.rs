//! Prompt-lookup drafts: speculative decoding without a draft model. The tokens that followed
//! the latest earlier occurrence of the sequence's last n tokens (the longest n that occurs) are
//! proposed as the next ones, and one step verifies them all ([`crate::decoder::GpuModel::step_drafted`]):
//! code edits, quotes, retrieved passages and loops repeat what came before, and each accepted
//! draft token is a decode step saved. Verification keeps the output exactly what decoding one
//! token at a time gives: greedy, the argmax of each row until one differs from its draft;
//! sampling, [`crate::runtime::sampler::Sampler::sample_with_draft`].

use crate::error::{Error, Result};

/// How drafts are looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptLookup {
    /// Longest n-gram looked up (the last n tokens; the longest that occurs earlier wins).
    pub ngram: usize,
    /// Most tokens drafted per step.
    pub max_draft: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup { ngram: 3, max_draft: 4 }
    }
}

impl PromptLookup {
    /// Refuses sizes outside 1..=32.
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [("draft n-gram", self.ngram), ("draft length", self.max_draft)] {
            if !(1..=32).contains(&v) {
                return Err(Error::InvalidArgument(format!("{what} {v} must be in 1..=32")));
            }
        }
        Ok(())
    }

    /// At most `limit` (and `max_draft`) tokens proposed after `history`: what followed the
    /// latest earlier occurrence of its last n tokens, for the longest n up to `ngram` that
    /// occurs; empty when none does.
    pub fn draft(&self, history: &[u32], limit: usize) -> Vec<u32> {
        let limit = limit.min(self.max_draft);
        let len = history.len();
        if limit == 0 {
            return Vec::new();
        }
        for n in (1..=self.ngram.min(len.saturating_sub(1))).rev() {
            let tail = &history[len - n..];
            // Latest first, never the tail itself.
            if let Some(start) = (0..len - n).rev().find(|&i| &history[i..i + n] == tail) {
                let after = start + n;
                return history[after..(after + limit).min(len)].to_vec();
            }
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::PromptLookup;

    #[test]
    fn drafts_follow_the_latest_longest_match() {
        let p = PromptLookup { ngram: 3, max_draft: 4 };
        // "5 6 7" occurred at 1..4, followed by 8 9; the latest "7" alone at 3 too.
        assert_eq!(p.draft(&[4, 5, 6, 7, 8, 9, 1, 5, 6, 7], 10), vec![8, 9, 1, 5]);
        assert_eq!(p.draft(&[4, 5, 6, 7, 8, 9, 1, 5, 6, 7], 2), vec![8, 9]);
        // Only a 1-gram occurs: what followed its latest occurrence.
        assert_eq!(p.draft(&[3, 1, 4, 3, 2, 9, 3], 4), vec![2, 9, 3]);
        assert!(p.draft(&[1, 2, 3], 4).is_empty());
        assert!(p.draft(&[7], 4).is_empty());
        assert!(p.draft(&[], 4).is_empty());
        assert!(PromptLookup { ngram: 0, max_draft: 4 }.validate().is_err());
        assert!(PromptLookup { ngram: 3, max_draft: 33 }.validate().is_err());
    }
}
