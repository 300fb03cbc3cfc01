//! The prerouter attached to a decoder: per MoE layer a router top-k that also captures the
//! last token's FFN input and routing, after the step every head on the GPU in one dispatch
//! (heads reading the next token's embedding instead in the next one-token step, right after its
//! embedding), and, with [`RoutingMode::Predicted`], router top-k kernels that take the heads'
//! prediction as the routing of the next one-token step.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::{router_shape, Ffn, GpuModel};
use crate::error::{Error, Result};
use crate::experts::predictor::PredictedRouting;
use crate::experts::residency::ExpertResidency;
use crate::gpu::{Gpu, Pass, Readback};
use crate::ops::prerouter_heads::{HeadToRun, PrerouterHeads, PrerouterHistory};
use crate::ops::router::{Capture, Forced, RouterTopK};
use crate::prerouter::compat::ModelDims;
use crate::prerouter::heads_file::Heads;

/// Where a MoE layer's experts come from during decoding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RoutingMode {
    /// The model's own router (exact).
    #[default]
    Native,
    /// Edge0's prediction-as-routing: in one-token steps, a layer with a prerouter head uses
    /// the experts the head predicted one token ahead (weighted by the native router's
    /// probabilities of those experts); other layers, prompt steps and a sequence's first
    /// token route natively.
    Predicted,
}

impl fmt::Display for RoutingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RoutingMode::Native => "native",
            RoutingMode::Predicted => "predicted",
        })
    }
}

impl FromStr for RoutingMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<RoutingMode> {
        match s.trim().to_ascii_lowercase().as_str() {
            "native" => Ok(RoutingMode::Native),
            "predicted" => Ok(RoutingMode::Predicted),
            _ => Err(Error::InvalidArgument(format!("unknown routing {s:?}; expected native or predicted"))),
        }
    }
}

/// The prerouter's kernels and state inside a [`GpuModel`].
pub(super) struct DecoderPrerouter {
    history: PrerouterHistory,
    /// Per model layer (MoE layers): the router top-k that also captures the heads' inputs.
    native: Vec<Option<RouterTopK>>,
    /// Per model layer: the capturing top-k taking the prediction as routing (predicted mode,
    /// layers with a head).
    forced: Vec<Option<RouterTopK>>,
    heads: PrerouterHeads,
    /// Per head: the model layer it predicts.
    targets: Vec<usize>,
    /// Reads the predictions back for the prefetcher, when one uses them.
    readback: Option<Readback>,
    /// Where they are read back to (`[heads, top_k]`), kept between steps.
    read_ids: std::sync::Mutex<Vec<u32>>,
    /// The heads read the next token's embedding (feature `token`): they run in a one-token step
    /// after its embedding ([`GpuModel::record_heads_after_embed`]), not at the end of the step
    /// before.
    reads_next_token: bool,
    /// A prediction for the next one-token step of the current sequence exists (heads reading
    /// the next token: the history holds the token before, so they make it in the step).
    ready: AtomicBool,
    top_k: usize,
}

impl DecoderPrerouter {
    /// Forgets the history unless the step `continues` the sequence of the previous step.
    pub(super) fn begin_step(&self, gpu: &Gpu, continues: bool) {
        if !continues {
            self.history.reset(gpu);
        }
        if !continues || self.reads_next_token {
            self.ready.store(continues, Ordering::Relaxed);
        }
    }

    /// The top-k to record for model layer `layer` in a step of `n` tokens (in place of the
    /// decoder's own): the forced one when predicted routing applies, else the capturing one.
    pub(super) fn router(&self, layer: usize, n: usize) -> Option<&RouterTopK> {
        let forced = self.forced.get(layer).and_then(Option::as_ref).filter(|_| self.forcing(layer, n));
        forced.or_else(|| self.native.get(layer).and_then(Option::as_ref))
    }

    /// Whether model layer `layer` takes the prediction as its routing in a step of `n` tokens.
    fn forcing(&self, layer: usize, n: usize) -> bool {
        n == 1 && self.ready.load(Ordering::Relaxed) && self.forced.get(layer).is_some_and(Option::is_some)
    }

    /// Whether the CPU already knows model layer `layer`'s routing in a step of `n` tokens: the
    /// prediction is its routing and was read back into the model's [`PredictedRouting`], so
    /// the step needs no GPU round trip to learn it.
    pub(super) fn routing_is_published(&self, layer: usize, n: usize) -> bool {
        self.readback.is_some() && self.forcing(layer, n)
    }

    /// Records every head at the end of a step (unless they read the next token).
    pub(super) fn record_heads(&self, gpu: &Gpu, pass: &mut Pass) {
        if !self.reads_next_token {
            self.heads.record(gpu, pass);
        }
    }

    /// After the step's submission: marks the prediction for the next token ready and, when a
    /// prefetcher reads it, publishes it ([`Self::publish`]); returns whether it did. Heads
    /// reading the next token have no prediction yet: theirs comes in the next step.
    pub(super) fn finish_step(&self, gpu: &Gpu, predicted: &PredictedRouting) -> Result<bool> {
        if self.reads_next_token {
            return Ok(false);
        }
        self.ready.store(true, Ordering::Relaxed);
        self.publish(gpu, predicted)
    }

    /// When a prefetcher reads the heads' prediction, reads it back (waiting for the heads'
    /// submission) into `predicted`, each predicted layer's experts; returns whether it did.
    fn publish(&self, gpu: &Gpu, predicted: &PredictedRouting) -> Result<bool> {
        let Some(readback) = &self.readback else { return Ok(false) };
        let mut ids = self.read_ids.lock().expect("prerouter readback lock");
        readback.read(gpu, &self.heads.predicted, 0, bytemuck::cast_slice_mut(&mut ids))?;
        for (&layer, experts) in self.targets.iter().zip(ids.chunks(self.top_k)) {
            predicted.set(layer, experts.iter().copied());
        }
        Ok(true)
    }
}

impl GpuModel {
    /// Loads the heads in `path`, checks them against this model's dimensions and attaches
    /// them ([`GpuModel::attach_prerouter`]).
    pub fn attach_prerouter_file(&mut self, path: &std::path::Path, routing: RoutingMode, publish: bool) -> Result<()> {
        let heads = Heads::load(path)?;
        ModelDims::of(self.spec())?.check(&heads.config.dims(), path)?;
        self.attach_prerouter(&heads, routing, publish)
    }

    /// Runs `heads` on the GPU after every step, or before each one-token step for heads
    /// reading the next token (their dimensions must match this model: check with
    /// [`crate::prerouter::compat::ModelDims`] first). With `routing`
    /// [`RoutingMode::Predicted`] their predictions become the routing of one-token steps; with
    /// `publish` they are read back into [`GpuModel::predicted_routing`] and the expert cache
    /// prefetches them for the next token.
    pub fn attach_prerouter(&mut self, heads: &Heads, routing: RoutingMode, publish: bool) -> Result<()> {
        let m =
            self.spec.moe.clone().ok_or_else(|| Error::InvalidArgument("prerouter heads need an MoE model".into()))?;
        let c = &heads.config;
        let moe_layers: Vec<usize> = (0..self.spec.layers).filter(|&i| self.spec.is_moe_layer(i)).collect();
        if c.moe_layers != moe_layers
            || c.hidden != self.spec.hidden
            || c.experts != m.num_experts
            || c.top_k != m.top_k
        {
            return Err(Error::InvalidArgument("the prerouter heads were trained for another model".into()));
        }
        let gpu = &*self.gpu;
        let ordinal = |layer: usize| moe_layers.iter().position(|&l| l == layer).expect("heads own MoE layers");
        let history = PrerouterHistory::new(gpu, moe_layers.len(), c.hidden, c.top_k);
        let to_run: Vec<HeadToRun<'_>> =
            heads.heads.iter().map(|h| HeadToRun { owner: ordinal(h.layer), params: &h.head.params }).collect();
        let dims = heads
            .heads
            .first()
            .map(|h| h.head.dims)
            .ok_or_else(|| Error::InvalidArgument("the prerouter heads file holds no head".into()))?;
        // The step's embedding leaves the next token's row at the front of `acts.x`.
        let next_embedding = c.features.token.then_some(&self.acts.x);
        let bound = PrerouterHeads::new(gpu, &history, &to_run, dims, c.features, next_embedding)?;
        let step = &self.step.buffer;
        let router = |layer: usize, forced: Option<Forced<'_>>| {
            let capture = Capture { hn: &self.acts.hn, history: &history, layer: ordinal(layer), hidden: c.hidden };
            let Ffn::Moe(moe) = &self.layers[layer].ffn else { unreachable!("heads own MoE layers") };
            let shape = router_shape(&m, moe.router_bias.as_deref());
            RouterTopK::with(gpu, step, self.acts.router_io(), shape, forced, Some(capture))
        };
        let native = (0..self.spec.layers).map(|l| moe_layers.contains(&l).then(|| router(l, None))).collect();
        let targets: Vec<usize> = heads.heads.iter().map(|h| h.target_layer).collect();
        let mut forced: Vec<Option<RouterTopK>> = (0..self.spec.layers).map(|_| None).collect();
        if routing == RoutingMode::Predicted {
            for (h, &target) in targets.iter().enumerate() {
                forced[target] = Some(router(target, Some(Forced { experts: &bound.predicted, offset: h * c.top_k })));
            }
        }
        let readback = publish.then(|| Readback::new(gpu, (targets.len() * c.top_k * 4) as u64));
        let read_ids = std::sync::Mutex::new(vec![0; targets.len() * c.top_k]);
        self.prerouter = Some(DecoderPrerouter {
            history,
            native,
            forced,
            heads: bound,
            targets,
            readback,
            read_ids,
            reads_next_token: c.features.token,
            ready: AtomicBool::new(false),
            top_k: c.top_k,
        });
        Ok(())
    }

    /// In a step of `n` tokens, after its embedding: heads reading the next token run on the
    /// step's token where it is one token continuing the sequence (so forced layers read their
    /// prediction), and where a prefetcher uses the prediction, `rec` is submitted, the
    /// prediction read back and the predicted experts queued on `residency` before the step
    /// begins there (their reads overlap the layers before theirs). Returns the pass to go on
    /// recording in.
    pub(super) fn record_heads_after_embed(
        &self,
        mut rec: Pass,
        n: usize,
        residency: Option<&mut ExpertResidency>,
    ) -> Result<Pass> {
        let gpu = &*self.gpu;
        let Some(p) = self.prerouter.as_ref().filter(|p| p.reads_next_token && n == 1) else { return Ok(rec) };
        if !p.ready.load(Ordering::Relaxed) {
            return Ok(rec);
        }
        if let Some(profiler) = gpu.profiler() {
            profiler.set_section("prerouter heads");
        }
        p.heads.record(gpu, &mut rec);
        if p.readback.is_none() {
            return Ok(rec);
        }
        rec.submit(&gpu.queue);
        if p.publish(gpu, &self.predicted)? {
            if let Some(r) = residency {
                r.prefetch_next_token(gpu, &self.predicted)?;
            }
        }
        Ok(Pass::new(&gpu.device))
    }
}
