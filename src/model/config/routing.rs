//! How an MoE router turns its logits into the chosen experts and their weights.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::fields::{opt_str, opt_usize};
use crate::error::{Error, Result};

/// The router's scoring and selection rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RoutingKind {
    /// Softmax over all experts, the `top_k` most probable (`greedy`).
    Softmax,
    /// Softmax; groups of `num_experts / n_group` experts ranked by their best probability,
    /// experts chosen within the best `topk_group` groups (DeepSeek-V2 `group_limited_greedy`).
    SoftmaxGroupLimited {
        /// Expert groups.
        n_group: usize,
        /// Groups kept.
        topk_group: usize,
    },
    /// Sigmoid scores; experts chosen by score + `e_score_correction_bias` within the best
    /// `topk_group` groups (ranked by the sum of their two best biased scores), weighted by the
    /// unbiased scores (DeepSeek-V3 / GLM-4.5 `noaux_tc`).
    SigmoidBiased {
        /// Expert groups.
        n_group: usize,
        /// Groups kept.
        topk_group: usize,
    },
}

impl RoutingKind {
    /// `(n_group, topk_group)`, `(1, 1)` for ungrouped routing.
    pub fn groups(&self) -> (usize, usize) {
        match *self {
            RoutingKind::Softmax => (1, 1),
            RoutingKind::SoftmaxGroupLimited { n_group, topk_group }
            | RoutingKind::SigmoidBiased { n_group, topk_group } => (n_group, topk_group),
        }
    }

    /// Whether the router has an `e_score_correction_bias`.
    pub fn has_bias(&self) -> bool {
        matches!(self, RoutingKind::SigmoidBiased { .. })
    }
}

fn groups(cfg: &Value, default: (usize, usize), experts: usize, top_k: usize) -> Result<(usize, usize)> {
    let n_group = opt_usize(cfg, "n_group")?.unwrap_or(default.0);
    let topk_group = opt_usize(cfg, "topk_group")?.unwrap_or(default.1);
    if n_group == 0 || !experts.is_multiple_of(n_group) {
        return Err(Error::UnsupportedConfig(format!("n_group {n_group} must divide the {experts} routed experts")));
    }
    if topk_group == 0 || topk_group > n_group || top_k > topk_group * (experts / n_group) {
        return Err(Error::UnsupportedConfig(format!(
            "topk_group {topk_group} must be in 1..={n_group} and its groups must hold num_experts_per_tok {top_k}"
        )));
    }
    Ok((n_group, topk_group))
}

fn expect_str(cfg: &Value, key: &str, allowed: &[&str], what: &str) -> Result<()> {
    match opt_str(cfg, key)? {
        Some(v) if !allowed.contains(&v) => {
            Err(Error::UnsupportedConfig(format!("{key} {v:?} is not implemented for {what} (expected {allowed:?})")))
        }
        _ => Ok(()),
    }
}

/// DeepSeek-V2's router: `topk_method` `greedy` or `group_limited_greedy`, softmax scoring.
pub(super) fn parse_softmax_topk_method(cfg: &Value, experts: usize, top_k: usize) -> Result<RoutingKind> {
    expect_str(cfg, "scoring_func", &["softmax"], "DeepSeek-V2")?;
    expect_str(cfg, "topk_method", &["greedy", "group_limited_greedy"], "DeepSeek-V2")?;
    Ok(match opt_str(cfg, "topk_method")?.unwrap_or("greedy") {
        "greedy" => RoutingKind::Softmax,
        _ => {
            let n = opt_usize(cfg, "n_group")?.ok_or_else(|| Error::ConfigField("n_group".into()))?;
            let (n_group, topk_group) = groups(cfg, (n, 0), experts, top_k)?;
            RoutingKind::SoftmaxGroupLimited { n_group, topk_group }
        }
    })
}

/// DeepSeek-V3's and GLM-4.5's router: sigmoid + correction bias (`noaux_tc`), groups defaulting
/// to `default_groups` as transformers does per family.
pub(super) fn parse_noaux_tc(
    cfg: &Value,
    experts: usize,
    top_k: usize,
    default_groups: (usize, usize),
) -> Result<RoutingKind> {
    expect_str(cfg, "scoring_func", &["sigmoid"], "DeepSeek-V3 / GLM-4.5")?;
    expect_str(cfg, "topk_method", &["noaux_tc"], "DeepSeek-V3 / GLM-4.5")?;
    let (n_group, topk_group) = groups(cfg, default_groups, experts, top_k)?;
    if experts / n_group < 2 {
        return Err(Error::UnsupportedConfig(format!(
            "noaux_tc ranks groups by their two best experts: n_group {n_group} leaves fewer than 2 per group"
        )));
    }
    Ok(RoutingKind::SigmoidBiased { n_group, topk_group })
}
