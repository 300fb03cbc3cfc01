//! The prerouter attached to a decoder: per MoE layer a router top-k that also captures the
//! last token's FFN input and routing, after the step every head on the GPU in one dispatch,
//! and, with [`RoutingMode::Predicted`], router top-k kernels that take the heads' prediction
//! as the routing of the next one-token step.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::{router_shape, GpuModel};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, Readback};
use crate::ops::prerouter_heads::{HeadToRun, PrerouterHeads, PrerouterHistory};
use crate::ops::router::{Capture, Forced, RouterTopK};
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

/// A model layer and the experts predicted for it.
pub(super) type LayerPrediction = (usize, Vec<u16>);

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
    /// The history holds a token of the current sequence, so a prediction exists.
    ready: AtomicBool,
    /// Per model layer: the experts the last read-back prediction gave it (with a readback).
    known: Mutex<Vec<Option<Vec<u32>>>>,
    top_k: usize,
}

impl DecoderPrerouter {
    /// At a sequence start (position 0) forgets the previous sequence.
    pub(super) fn begin_step(&self, gpu: &Gpu, pos: usize) {
        if pos == 0 {
            self.history.reset(gpu);
            self.ready.store(false, Ordering::Relaxed);
        }
    }

    /// The top-k to record for model layer `layer` in a step of `n` tokens (in place of the
    /// decoder's own): the forced one when predicted routing applies, else the capturing one.
    pub(super) fn router(&self, layer: usize, n: usize) -> Option<&RouterTopK> {
        let forced = self.forced.get(layer).and_then(Option::as_ref);
        let forced = forced.filter(|_| n == 1 && self.ready.load(Ordering::Relaxed));
        forced.or_else(|| self.native.get(layer).and_then(Option::as_ref))
    }

    /// Model layer `layer`'s routing in a step of `n` tokens when the CPU already knows it:
    /// the forced router applies and the prediction it reads was read back. The step then
    /// needs no GPU round trip to learn it.
    pub(super) fn known_routing(&self, layer: usize, n: usize) -> Option<Vec<u32>> {
        let forced = self.forced.get(layer).is_some_and(Option::is_some);
        if !forced || n != 1 || !self.ready.load(Ordering::Relaxed) {
            return None;
        }
        self.known.lock().expect("prerouter lock").get(layer).cloned().flatten()
    }

    /// Records every head (at the end of a step).
    pub(super) fn record_heads(&self, gpu: &Gpu, pass: &mut wgpu::ComputePass<'_>) {
        self.heads.record(gpu, pass);
    }

    /// After the step's submission: marks the prediction ready and, when a prefetcher reads
    /// it, returns each predicted layer's experts.
    pub(super) fn finish_step(&self, gpu: &Gpu) -> Result<Option<Vec<LayerPrediction>>> {
        self.ready.store(true, Ordering::Relaxed);
        let Some(readback) = &self.readback else { return Ok(None) };
        let mut ids = vec![0u32; self.targets.len() * self.top_k];
        readback.read(gpu, &self.heads.predicted, 0, bytemuck::cast_slice_mut(&mut ids))?;
        let mut known = self.known.lock().expect("prerouter lock");
        for (&l, es) in self.targets.iter().zip(ids.chunks(self.top_k)) {
            known[l] = Some(es.to_vec());
        }
        let per_layer =
            self.targets.iter().zip(ids.chunks(self.top_k)).map(|(&l, es)| (l, es.iter().map(|&e| e as u16).collect()));
        Ok(Some(per_layer.collect()))
    }
}

impl GpuModel {
    /// Runs `heads` on the GPU after every step (their dimensions must match this model:
    /// check with [`crate::prerouter::compat::ModelDims`] first). With `routing`
    /// [`RoutingMode::Predicted`] their predictions become the routing of one-token steps; with
    /// `publish` they are read back after each step into [`GpuModel::predicted_routing`] and
    /// the expert cache prefetches them for the next token.
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
        let bound = PrerouterHeads::new(gpu, &history, &to_run, dims, c.features)?;
        let step = &self.step.buffer;
        let router = |layer: usize, forced: Option<Forced<'_>>| {
            let capture = Capture { hn: &self.acts.hn, history: &history, layer: ordinal(layer), hidden: c.hidden };
            RouterTopK::with(gpu, step, self.acts.router_io(), router_shape(&m), forced, Some(capture))
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
        self.prerouter = Some(DecoderPrerouter {
            history,
            native,
            forced,
            heads: bound,
            targets,
            readback,
            ready: AtomicBool::new(false),
            known: Mutex::new(vec![None; self.spec.layers]),
            top_k: c.top_k,
        });
        Ok(())
    }
}
