//! Scoring trained heads on routing they were not trained on (`moestream prerouter eval`): every
//! sample of a dataset collected from a held-out text, per head and on average, beside the
//! persistence and router baselines.

use serde::Serialize;

use super::dataset::Dataset;
use super::error::PrerouterError;
use super::heads_file::Heads;
use super::parallel::map_in_threads;
use super::routers::ModelTables;
use super::samples::{token_inputs, HeadInputs};
use super::score::{mean, score_head, HeadScore};

/// One head's figures on the evaluation text.
#[derive(Clone, Debug, Serialize)]
pub struct EvalLayer {
    /// Model layer index of the MoE layer owning the head (N).
    pub layer: usize,
    /// Model layer index of the MoE layer it predicts (N+1).
    pub target_layer: usize,
    /// The head's and the baselines' scores.
    #[serde(flatten)]
    pub score: HeadScore,
}

/// Every head's figures and their means.
#[derive(Clone, Debug, Serialize)]
pub struct EvalReport {
    /// Tokens of the evaluation text recorded.
    pub tokens: usize,
    /// Experts per token (the k of recall@k).
    pub top_k: usize,
    /// Per head, in layer order.
    pub layers: Vec<EvalLayer>,
    /// Mean recall@k of the heads.
    pub mean_recall: f64,
    /// Mean exact-set match of the heads.
    pub mean_exact_match: f64,
    /// Mean recall of the heads' 2k best.
    pub mean_recall_2k: f64,
    /// Mean recall@k of the persistence baseline.
    pub mean_persistence_recall: f64,
    /// Mean recall@k of the router baseline.
    pub mean_router_recall: f64,
}

/// Scores every head of `heads` on `samples` of `data`; `model` holds every MoE layer's router
/// in the dataset's order (and the embeddings, for heads reading the next token). The caller has
/// checked that the heads were made for the dataset's model
/// ([`ModelDims::check`](super::compat::ModelDims::check)).
pub fn evaluate(
    data: &Dataset,
    heads: &Heads,
    model: &ModelTables,
    samples: &[usize],
    threads: usize,
) -> Result<EvalReport, PrerouterError> {
    let (m, routers) = (&data.meta, &model.routers);
    let features = heads.config.features;
    let embeddings = token_inputs(data, features, model.embeddings.as_deref())?;
    if routers.len() != m.moe_layers.len() {
        return Err(PrerouterError::InvalidArgument("one router per MoE layer is needed".into()));
    }
    if samples.is_empty() {
        return Err(PrerouterError::InvalidArgument(format!("{} tokens give no sample to score", m.tokens)));
    }
    let owners = heads
        .heads
        .iter()
        .map(|h| {
            m.moe_layers.iter().position(|&l| l == h.layer).filter(|j| j + 1 < m.moe_layers.len()).ok_or_else(|| {
                PrerouterError::InvalidArgument(format!(
                    "the head of layer {} has no MoE layer after it in the data (MoE layers {:?})",
                    h.layer, m.moe_layers
                ))
            })
        })
        .collect::<Result<Vec<usize>, _>>()?;
    let layers = map_in_threads(owners.len(), threads, |i| {
        let (j, head) = (owners[i], &heads.heads[i]);
        let inputs = HeadInputs { data, j, features, embeddings };
        EvalLayer {
            layer: head.layer,
            target_layer: head.target_layer,
            score: score_head(&inputs, &head.head, &routers[j + 1], samples),
        }
    });
    Ok(EvalReport {
        tokens: m.tokens,
        top_k: m.top_k,
        mean_recall: mean(layers.iter().map(|l| l.score.head.recall)),
        mean_exact_match: mean(layers.iter().map(|l| l.score.head.exact_match)),
        mean_recall_2k: mean(layers.iter().map(|l| l.score.recall_2k)),
        mean_persistence_recall: mean(layers.iter().map(|l| l.score.persistence.recall)),
        mean_router_recall: mean(layers.iter().map(|l| l.score.router.recall)),
        layers,
    })
}
