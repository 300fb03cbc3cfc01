//! Running trained heads during generation: fed by the decoder's layer observer, they write
//! each layer's predicted experts for the next token into a [`PredictedRouting`], which the
//! [`PrerouterPredictor`](crate::experts::predictor::PrerouterPredictor) turns into prefetches.
//!
//! When the last MoE layer's routing of the step's last token t arrives, every head runs (the
//! one owned by layer N on `h_N(t)` and the routing of t and t−1) and predicts layer N+1 at
//! t+1. The prediction is read after routing layer N of the next step. Across
//! requests the t−1 routing is the previous request's last token: only a hint is affected.

use std::path::Path;

use super::compat::ModelDims;
use super::error::PrerouterError;
use super::features::RoutingContext;
use super::head::Tape;
use super::heads_file::Heads;
use super::metrics::top_k;
use crate::experts::predictor::PredictedRouting;
use crate::model::decoder::GpuModel;

/// The heads and the last tokens' per-layer inputs.
pub struct PrerouterRuntime {
    heads: Heads,
    predicted: PredictedRouting,
    /// Per MoE layer (heads-config order): the last token's `hn`.
    hidden: Vec<Vec<f32>>,
    /// Per MoE layer: the last token's routed ids.
    cur: Vec<Vec<u16>>,
    /// Per MoE layer: the routed ids of the token before.
    prev: Vec<Vec<u16>>,
    tape: Tape,
    logits: Vec<f32>,
}

impl PrerouterRuntime {
    /// Runs `heads` and publishes their predictions to `predicted`.
    pub fn new(heads: Heads, predicted: PredictedRouting) -> PrerouterRuntime {
        let layers = heads.config.moe_layers.len();
        let experts = heads.config.experts;
        PrerouterRuntime {
            heads,
            predicted,
            hidden: vec![Vec::new(); layers],
            cur: vec![Vec::new(); layers],
            prev: vec![Vec::new(); layers],
            tape: Tape::default(),
            logits: vec![0.0; experts],
        }
    }

    /// Takes MoE layer `layer`'s `hn` rows and routed ids of a step (a layer observer's call);
    /// after the last MoE layer, runs every head on the step's last token.
    pub fn observe(&mut self, layer: usize, hn: &[f32], ids: &[u32]) {
        let c = &self.heads.config;
        let (Some(j), k, h) = (c.moe_layers.iter().position(|&l| l == layer), c.top_k, c.hidden) else { return };
        let n = ids.len() / k;
        if n == 0 || hn.len() != n * h {
            return;
        }
        let row = |t: usize| ids[t * k..(t + 1) * k].iter().map(|&e| e as u16).collect::<Vec<u16>>();
        self.prev[j] = if n >= 2 { row(n - 2) } else { std::mem::take(&mut self.cur[j]) };
        self.cur[j] = row(n - 1);
        self.hidden[j] = hn[(n - 1) * h..].to_vec();
        if j + 1 == c.moe_layers.len() {
            self.predict();
        }
    }

    /// Every head's top-k for the next token, published per target layer.
    fn predict(&mut self) {
        let c = &self.heads.config;
        let last = c.moe_layers.len() - 1;
        for th in &self.heads.heads {
            let Some(owner) = c.moe_layers.iter().position(|&l| l == th.layer).filter(|&o| o < last) else { continue };
            let target = owner + 1;
            let ctx = RoutingContext {
                next: &self.cur[target],
                prev: (!self.prev[target].is_empty()).then_some(self.prev[target].as_slice()),
                own: &self.cur[owner],
            };
            let active = c.features.active(c.experts, &ctx);
            let mut x = self.hidden[owner].clone();
            if c.features.deep {
                x.extend_from_slice(&self.hidden[last]);
            }
            th.head.forward(&x, &active, &mut self.tape, &mut self.logits);
            self.predicted.set(th.target_layer, top_k(&self.logits, c.top_k));
        }
    }
}

/// Loads the heads in `path`, checks them against `model`'s dimensions and installs them as
/// `model`'s layer observer feeding its [`PredictedRouting`] (read by `--prefetch prerouter`).
pub fn attach(model: &GpuModel, path: &Path) -> Result<(), PrerouterError> {
    let heads = Heads::load(path)?;
    ModelDims::of(model.spec())?.check(&heads.config.dims(), path)?;
    let mut runtime = PrerouterRuntime::new(heads, model.predicted_routing().clone());
    model.set_observer(Some(Box::new(move |layer, hn, ids| runtime.observe(layer, hn, ids))));
    Ok(())
}
