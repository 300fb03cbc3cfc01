//! Prefetch predictors: which experts of later layers are likely to be routed next.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::experts::policy::eamc::prefetch_priority;
use crate::experts::policy::{ExpertId, PolicyContext};

/// Guesses the experts later layers will need, from what has been routed so far.
pub trait Predictor: Send {
    /// Short name, as used on the command line.
    fn name(&self) -> &'static str;
    /// After routing `layer`: experts of later layers only, most likely first.
    fn predict(&mut self, layer: usize, ctx: &PolicyContext) -> Vec<ExpertId>;
    /// Whether prefetching `candidate` is worth evicting `victim` (the policy's choice); free
    /// slots are always used. Default: yes.
    fn worth_evicting(&self, _candidate: ExpertId, _victim: ExpertId, _ctx: &PolicyContext) -> bool {
        true
    }
    /// After a step: experts of every layer the next token is expected to use, nearest layer
    /// first (a one-token-ahead predictor's whole prediction). Default: none.
    fn next_token(&mut self, _ctx: &PolicyContext) -> Vec<ExpertId> {
        Vec::new()
    }
}

/// Default number of later layers (with any predicted activation) an [`EamcPredictor`] covers.
pub const DEFAULT_LOOKAHEAD: usize = 2;

/// MoE-Infinity's prefetch: PredictEAM over the next few layers, weighted by `1 − (i − l)/L`.
pub struct EamcPredictor {
    lookahead: usize,
}

impl EamcPredictor {
    /// A predictor covering the next `lookahead` layers that have predicted activations.
    pub fn new(lookahead: usize) -> EamcPredictor {
        EamcPredictor { lookahead }
    }
}

impl Default for EamcPredictor {
    fn default() -> EamcPredictor {
        EamcPredictor::new(DEFAULT_LOOKAHEAD)
    }
}

impl Predictor for EamcPredictor {
    fn name(&self) -> &'static str {
        "eamc"
    }

    fn predict(&mut self, layer: usize, ctx: &PolicyContext) -> Vec<ExpertId> {
        ctx.eam.predict(layer, self.lookahead).into_iter().map(|(id, _)| id).collect()
    }

    /// Only when the candidate's priority (the paper's, [`prefetch_priority`]) beats the
    /// victim's, so prefetch never pushes out an expert the prediction values more.
    fn worth_evicting(&self, candidate: ExpertId, victim: ExpertId, ctx: &PolicyContext) -> bool {
        let prediction = ctx.eam.prediction();
        let layers = ctx.layers();
        prefetch_priority(&prediction, candidate, layers) > prefetch_priority(&prediction, victim, layers)
    }
}

/// Each layer's experts predicted for the coming token (most likely first), shared between
/// whoever predicts them (the prerouter heads, run at the end of a step, or just before it for
/// heads reading the next token; see `decoder::GpuModel::attach_prerouter_file`) and the
/// [`PrerouterPredictor`] that turns them into prefetches (or a trace replay, which sets them
/// from the trace's `predicted` lines).
#[derive(Clone, Debug, Default)]
pub struct PredictedRouting(Arc<Mutex<Vec<Vec<u16>>>>);

impl PredictedRouting {
    /// Replaces `layer`'s prediction (in place: no allocation once the layer has held one).
    pub fn set(&self, layer: usize, experts: impl IntoIterator<Item = u32>) {
        let mut p = self.0.lock().expect("predicted routing lock");
        if p.len() <= layer {
            p.resize(layer + 1, Vec::new());
        }
        p[layer].clear();
        p[layer].extend(experts.into_iter().map(|e| e as u16));
    }

    /// Predicted experts of the layers after `layer`, nearest layer first.
    pub fn after(&self, layer: usize) -> Vec<ExpertId> {
        self.layers_from(layer + 1)
    }

    /// Predicted experts of every layer, nearest layer first.
    pub fn all(&self) -> Vec<ExpertId> {
        self.layers_from(0)
    }

    /// `layer`'s predicted experts, if it has a prediction.
    pub fn ids_of(&self, layer: usize) -> Option<Vec<u32>> {
        let p = self.0.lock().expect("predicted routing lock");
        p.get(layer).filter(|es| !es.is_empty()).map(|es| es.iter().map(|&e| u32::from(e)).collect())
    }

    /// Whether `id` is predicted.
    pub fn contains(&self, id: ExpertId) -> bool {
        let p = self.0.lock().expect("predicted routing lock");
        p.get(id.layer as usize).is_some_and(|es| es.iter().any(|&e| u32::from(e) == id.expert))
    }

    /// Every predicted layer and its experts (as a trace's `predicted` line holds them).
    pub fn layers(&self) -> Vec<(u32, Vec<u32>)> {
        let p = self.0.lock().expect("predicted routing lock");
        let predicted = p.iter().enumerate().filter(|(_, es)| !es.is_empty());
        predicted.map(|(l, es)| (l as u32, es.iter().map(|&e| u32::from(e)).collect())).collect()
    }

    fn layers_from(&self, first: usize) -> Vec<ExpertId> {
        let p = self.0.lock().expect("predicted routing lock");
        let later = p.iter().enumerate().skip(first);
        later.flat_map(|(l, es)| es.iter().map(move |&e| ExpertId::new(l, usize::from(e)))).collect()
    }
}

/// Edge0's prefetch as a hint: after a layer's routing, the experts the prerouter heads
/// predicted (one token ahead) for the later layers. Routing itself stays exact.
pub struct PrerouterPredictor {
    predicted: PredictedRouting,
}

impl PrerouterPredictor {
    /// A predictor reading `predicted`.
    pub fn new(predicted: PredictedRouting) -> PrerouterPredictor {
        PrerouterPredictor { predicted }
    }
}

impl Predictor for PrerouterPredictor {
    fn name(&self) -> &'static str {
        "prerouter"
    }

    fn predict(&mut self, layer: usize, _ctx: &PolicyContext) -> Vec<ExpertId> {
        self.predicted.after(layer)
    }

    fn next_token(&mut self, _ctx: &PolicyContext) -> Vec<ExpertId> {
        self.predicted.all()
    }
}

/// Both: the prerouter's one-token-ahead prediction first, then MoE-Infinity's EAMC guesses
/// for the next layers. A predicted expert is always worth a slot; an EAMC guess only by EAMC
/// priority.
pub struct PrerouterEamcPredictor {
    prerouter: PrerouterPredictor,
    eamc: EamcPredictor,
}

impl Predictor for PrerouterEamcPredictor {
    fn name(&self) -> &'static str {
        "prerouter+eamc"
    }

    fn predict(&mut self, layer: usize, ctx: &PolicyContext) -> Vec<ExpertId> {
        let mut out = self.prerouter.predict(layer, ctx);
        for id in self.eamc.predict(layer, ctx) {
            if !out.contains(&id) {
                out.push(id);
            }
        }
        out
    }

    fn worth_evicting(&self, candidate: ExpertId, victim: ExpertId, ctx: &PolicyContext) -> bool {
        self.prerouter.predicted.contains(candidate) || self.eamc.worth_evicting(candidate, victim, ctx)
    }

    fn next_token(&mut self, ctx: &PolicyContext) -> Vec<ExpertId> {
        self.prerouter.next_token(ctx)
    }
}

/// The prefetchers selectable by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PrefetchKind {
    /// Demand loading only.
    None,
    /// [`EamcPredictor`].
    Eamc,
    /// [`PrerouterPredictor`] (needs trained heads attached to the engine).
    Prerouter,
    /// [`PrerouterEamcPredictor`] (needs trained heads attached to the engine).
    #[serde(rename = "prerouter+eamc")]
    PrerouterEamc,
}

impl PrefetchKind {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            PrefetchKind::None => "none",
            PrefetchKind::Eamc => "eamc",
            PrefetchKind::Prerouter => "prerouter",
            PrefetchKind::PrerouterEamc => "prerouter+eamc",
        }
    }

    /// Whether this prefetcher reads the prerouter heads' predictions.
    pub fn uses_prerouter(self) -> bool {
        matches!(self, PrefetchKind::Prerouter | PrefetchKind::PrerouterEamc)
    }

    /// The predictor, if any (a prerouter predictor that nothing feeds predicts nothing).
    pub fn build(self) -> Option<Box<dyn Predictor>> {
        self.build_with(&PredictedRouting::default())
    }

    /// The predictor, if any; a prerouter predictor reads `predicted`.
    pub fn build_with(self, predicted: &PredictedRouting) -> Option<Box<dyn Predictor>> {
        match self {
            PrefetchKind::None => None,
            PrefetchKind::Eamc => Some(Box::new(EamcPredictor::default())),
            PrefetchKind::Prerouter => Some(Box::new(PrerouterPredictor::new(predicted.clone()))),
            PrefetchKind::PrerouterEamc => Some(Box::new(PrerouterEamcPredictor {
                prerouter: PrerouterPredictor::new(predicted.clone()),
                eamc: EamcPredictor::default(),
            })),
        }
    }
}

impl fmt::Display for PrefetchKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PrefetchKind {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<PrefetchKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(PrefetchKind::None),
            "eamc" => Ok(PrefetchKind::Eamc),
            "prerouter" => Ok(PrefetchKind::Prerouter),
            "prerouter+eamc" | "eamc+prerouter" => Ok(PrefetchKind::PrerouterEamc),
            _ => Err(crate::Error::InvalidArgument(format!(
                "unknown prefetcher {s:?}; expected none, eamc, prerouter or prerouter+eamc"
            ))),
        }
    }
}
