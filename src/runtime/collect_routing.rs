//! Collecting the prerouter's training data: teacher-force token sequences through an engine with a layer
//! observer installed and stream each token's per-MoE-layer `hn` and routed ids to a dataset.

use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::prerouter::dataset::{DatasetMeta, DatasetWriter, FORMAT_VERSION};
use crate::prerouter::error::PrerouterError;
use crate::Engine;

/// Turns the observer's per-layer calls (all tokens of a step, layer by layer) into per-token
/// records (all layers of a token) for the writer. Holds one step's worth of rows.
struct StepBuffer {
    writer: DatasetWriter,
    /// Every token teacher-forced, in the order the steps record them.
    tokens: Vec<u32>,
    /// Next expected index into `moe_layers` within the current step.
    next: usize,
    /// Tokens of the current step.
    n: usize,
    hidden: Vec<Vec<f32>>,
    ids: Vec<Vec<u32>>,
    error: Option<PrerouterError>,
}

impl StepBuffer {
    fn observe(&mut self, layer: usize, hn: &[f32], ids: &[u32]) {
        if self.error.is_none() {
            if let Err(e) = self.try_observe(layer, hn, ids) {
                self.error = Some(e);
            }
        }
    }

    fn try_observe(&mut self, layer: usize, hn: &[f32], ids: &[u32]) -> Result<(), PrerouterError> {
        let meta = self.writer.meta().clone();
        let n = ids.len() / meta.top_k;
        if self.next == 0 {
            self.n = n;
        }
        if meta.moe_layers.get(self.next) != Some(&layer) || n != self.n || hn.len() != n * meta.hidden {
            return Err(PrerouterError::InvalidArgument(format!(
                "observer saw layer {layer} with {n} tokens, expected MoE layer {:?} with {}",
                meta.moe_layers.get(self.next),
                self.n
            )));
        }
        self.hidden[self.next] = hn.to_vec();
        self.ids[self.next] = ids.to_vec();
        self.next += 1;
        if self.next == meta.moe_layers.len() {
            self.next = 0;
            let (h, k) = (meta.hidden, meta.top_k);
            for t in 0..n {
                let hidden: Vec<f32> = self.hidden.iter().flat_map(|l| &l[t * h..(t + 1) * h]).copied().collect();
                let ids: Vec<u16> = self.ids.iter().flat_map(|l| &l[t * k..(t + 1) * k]).map(|&e| e as u16).collect();
                let recorded = self.writer.meta().tokens;
                let token = *self.tokens.get(recorded).ok_or_else(|| {
                    PrerouterError::InvalidArgument(format!("the observer saw more than the {recorded} tokens forced"))
                })?;
                self.writer.push(token, &hidden, &ids)?;
            }
        }
        Ok(())
    }
}

/// Teacher-forces `tokens` through `engine` in sequences of `window` tokens (each from
/// position 0; capped to the engine's context) and writes what every MoE layer saw to `dir`.
/// Every token but the last is recorded (the last is only a prediction target of scoring).
pub fn collect(engine: &Engine, tokens: &[u32], dir: &Path, window: usize) -> Result<DatasetMeta, PrerouterError> {
    let spec = engine.spec();
    let moe = spec.moe.as_ref().ok_or_else(|| PrerouterError::InvalidArgument("the model has no MoE layers".into()))?;
    if tokens.len() < 2 {
        return Err(PrerouterError::InvalidArgument(format!("{} tokens; at least 2 are needed", tokens.len())));
    }
    let window = window.clamp(1, engine.context().saturating_sub(1).max(1));
    let meta = DatasetMeta {
        version: FORMAT_VERSION,
        tokens: 0,
        hidden: spec.hidden,
        experts: moe.num_experts,
        top_k: moe.top_k,
        moe_layers: (0..spec.layers).filter(|&i| spec.is_moe_layer(i)).collect(),
        window,
    };
    let layers = meta.moe_layers.len();
    let buffer = Arc::new(Mutex::new(StepBuffer {
        writer: DatasetWriter::create(dir, meta)?,
        tokens: tokens.to_vec(),
        next: 0,
        n: 0,
        hidden: vec![Vec::new(); layers],
        ids: vec![Vec::new(); layers],
        error: None,
    }));
    let shared = buffer.clone();
    engine.set_observer(Some(Box::new(move |layer, hn, ids| {
        shared.lock().expect("collect buffer lock").observe(layer, hn, ids)
    })));
    let recorded = tokens.len() - 1;
    let run = (0..recorded).step_by(window).try_for_each(|start| {
        let end = (start + window).min(recorded);
        engine.score(&tokens[start..=end]).map(|_| ())
    });
    engine.set_observer(None);
    run?;
    let buffer = Arc::try_unwrap(buffer)
        .unwrap_or_else(|_| unreachable!("the observer was removed"))
        .into_inner()
        .expect("collect buffer lock");
    if let Some(e) = buffer.error {
        return Err(e);
    }
    buffer.writer.finish()
}
