//! Routing traces: what every token chose at every MoE layer, for offline study (`--trace FILE`,
//! `simulate`, `trace-stats`).
//!
//! The format is JSON lines. The first line is a header:
//!
//! ```text
//! {"format":"moestream-trace","version":1,"layers":L,"experts":E,"top_k":k,"moe_layers":[...],"expert_bytes":B}
//! ```
//!
//! `layers` counts all model layers, `moe_layers` lists those with routed experts and
//! `expert_bytes` is the size of one expert in the store. Then one line per event:
//!
//! ```text
//! {"request":N}
//! {"step":{"phase":"prefill"|"decode","tokens":T,"layers":[[layer,[T*k expert ids]],...]}}
//! {"predicted":[[layer,[k expert ids]],...]}
//! ```
//!
//! A `request` line opens request `N` (it ends at the next one or at the end of the file). A
//! step's ids for one layer are token-major: token 0's k ids, then token 1's, and so on. A
//! `predicted` line records the prerouter heads' prediction for the next token (most likely
//! first), where a run with `--prefetch prerouter` handed it to the expert cache, so a replay
//! can prefetch as that run did. Blank lines are ignored.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::experts::policy::Phase;
use crate::model::config_limits::{MAX_EXPERTS, MAX_LAYERS};

/// The `format` value of a trace header.
pub const TRACE_FORMAT: &str = "moestream-trace";
/// The trace format version this build reads and writes.
pub const TRACE_VERSION: u32 = 1;

/// Largest `expert_bytes` a header may give (1 TiB; byte totals stay far from overflow).
pub const MAX_EXPERT_BYTES: u64 = 1 << 40;

/// Errors reading or writing traces.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The trace file could not be opened or created.
    #[error("cannot open trace {path}: {source}")]
    Open {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Reading or writing failed midway.
    #[error("trace I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not valid trace JSON or breaks the header's dimensions.
    #[error("trace line {line}: {message}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

impl From<TraceError> for crate::Error {
    fn from(e: TraceError) -> crate::Error {
        match e {
            TraceError::Open { path, source } => crate::Error::Io { path, source },
            other => crate::Error::InvalidArgument(other.to_string()),
        }
    }
}

/// The first line of a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceHeader {
    /// Always [`TRACE_FORMAT`].
    pub format: String,
    /// Always [`TRACE_VERSION`].
    pub version: u32,
    /// Model layers (dense ones included).
    pub layers: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Indices of the layers with routed experts.
    pub moe_layers: Vec<u32>,
    /// Bytes of one expert in the store.
    pub expert_bytes: u64,
}

impl TraceHeader {
    /// A header of the current format and version.
    pub fn new(layers: usize, experts: usize, top_k: usize, moe_layers: Vec<u32>, expert_bytes: u64) -> TraceHeader {
        TraceHeader {
            format: TRACE_FORMAT.into(),
            version: TRACE_VERSION,
            layers,
            experts,
            top_k,
            moe_layers,
            expert_bytes,
        }
    }

    /// Routed experts over all MoE layers.
    pub fn total_experts(&self) -> usize {
        self.moe_layers.len() * self.experts
    }

    fn validate(&self) -> Result<(), String> {
        if self.format != TRACE_FORMAT || self.version != TRACE_VERSION {
            return Err(format!(
                "expected format {TRACE_FORMAT:?} version {TRACE_VERSION}, found {:?} version {}",
                self.format, self.version
            ));
        }
        if !(1..=MAX_LAYERS).contains(&self.layers)
            || !(1..=MAX_EXPERTS).contains(&self.experts)
            || self.top_k == 0
            || self.top_k > self.experts
            || self.expert_bytes > MAX_EXPERT_BYTES
        {
            return Err(format!(
                "bad dimensions: layers {} (1..={MAX_LAYERS}), experts {} (1..={MAX_EXPERTS}), top_k {}, expert_bytes {} (at most {MAX_EXPERT_BYTES})",
                self.layers, self.experts, self.top_k, self.expert_bytes
            ));
        }
        let mut sorted = self.moe_layers.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!("moe_layers {:?} repeats a layer", self.moe_layers));
        }
        match self.moe_layers.iter().find(|&&l| l as usize >= self.layers) {
            Some(l) => Err(format!("MoE layer {l} is not below layers {}", self.layers)),
            None => Ok(()),
        }
    }
}

/// One forward step's routing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceStep {
    /// Prefill or decode.
    pub phase: Phase,
    /// Tokens in the step.
    pub tokens: usize,
    /// Per MoE layer, in execution order: (layer, `tokens × top_k` expert ids, token-major).
    pub layers: Vec<(u32, Vec<u32>)>,
}

/// One line after the header.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceEvent {
    /// A request starts.
    Request(u64),
    /// A step of the current request.
    Step(TraceStep),
    /// The prerouter's prediction for the next token, per MoE layer with a head: (layer, ids).
    Predicted(Vec<(u32, Vec<u32>)>),
}

impl TraceEvent {
    fn validate(&self, h: &TraceHeader) -> Result<(), String> {
        match self {
            TraceEvent::Request(_) => Ok(()),
            // Most likely first, at most top_k of each layer.
            TraceEvent::Predicted(layers) => layers.iter().try_for_each(|(layer, ids)| {
                check_ids(h, "predicted layer", *layer, ids)?;
                match ids.len() <= h.top_k {
                    true => Ok(()),
                    false => Err(format!("predicted layer {layer} has {} ids, more than top_k {}", ids.len(), h.top_k)),
                }
            }),
            TraceEvent::Step(step) => step.layers.iter().try_for_each(|(layer, ids)| {
                check_ids(h, "layer", *layer, ids)?;
                match Some(ids.len()) == step.tokens.checked_mul(h.top_k) {
                    true => Ok(()),
                    false => Err(format!(
                        "layer {layer} has {} ids, expected tokens {} × top_k {}",
                        ids.len(),
                        step.tokens,
                        h.top_k
                    )),
                }
            }),
        }
    }
}

/// Checks that `layer` is a MoE layer of the header and every one of its `ids` an expert
/// below its count (`what` names the layer in the message).
fn check_ids(h: &TraceHeader, what: &str, layer: u32, ids: &[u32]) -> Result<(), String> {
    if !h.moe_layers.contains(&layer) {
        return Err(format!("{what} {layer} is not a MoE layer of the header"));
    }
    match ids.iter().find(|&&e| e as usize >= h.experts) {
        Some(e) => Err(format!("{what} {layer}: expert {e} is not below {}", h.experts)),
        None => Ok(()),
    }
}

/// Streams a trace out, one line per event (buffer the writer for files).
pub struct TraceWriter<W: Write> {
    out: W,
}

impl TraceWriter<BufWriter<File>> {
    /// Creates (truncates) `path` and writes the header.
    pub fn create(path: &Path, header: &TraceHeader) -> Result<Self, TraceError> {
        let file = File::create(path).map_err(|source| TraceError::Open { path: path.into(), source })?;
        TraceWriter::new(BufWriter::new(file), header)
    }
}

impl<W: Write> TraceWriter<W> {
    /// Writes the header to `out`.
    pub fn new(out: W, header: &TraceHeader) -> Result<Self, TraceError> {
        let mut w = TraceWriter { out };
        w.line(header)?;
        Ok(w)
    }

    /// Writes any event.
    pub fn event(&mut self, event: &TraceEvent) -> Result<(), TraceError> {
        self.line(event)
    }

    /// Writes `{"request":id}`.
    pub fn request(&mut self, id: u64) -> Result<(), TraceError> {
        self.line(&TraceEvent::Request(id))
    }

    /// Writes one step (borrowing its routing).
    pub fn step(&mut self, phase: Phase, tokens: usize, layers: &[(u32, Vec<u32>)]) -> Result<(), TraceError> {
        #[derive(Serialize)]
        struct StepRef<'a> {
            phase: Phase,
            tokens: usize,
            layers: &'a [(u32, Vec<u32>)],
        }
        #[derive(Serialize)]
        struct Line<'a> {
            step: StepRef<'a>,
        }
        self.line(&Line { step: StepRef { phase, tokens, layers } })
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.out.flush()?;
        Ok(self.out)
    }

    fn line(&mut self, value: &impl Serialize) -> Result<(), TraceError> {
        serde_json::to_writer(&mut self.out, value).map_err(std::io::Error::from)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }
}

/// Streams a trace in: the header up front, then events as an iterator.
pub struct TraceReader<R: BufRead> {
    lines: std::io::Lines<R>,
    line: usize,
    header: TraceHeader,
}

impl TraceReader<BufReader<File>> {
    /// Opens `path` and reads its header.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let file = File::open(path).map_err(|source| TraceError::Open { path: path.into(), source })?;
        TraceReader::new(BufReader::new(file))
    }
}

impl<R: BufRead> TraceReader<R> {
    /// Reads and checks the header line.
    pub fn new(input: R) -> Result<Self, TraceError> {
        let mut lines = input.lines();
        let mut line = 0;
        let text = loop {
            line += 1;
            match lines.next() {
                None => return Err(TraceError::Line { line, message: "empty trace: expected a header".into() }),
                Some(text) => {
                    let text = text?;
                    if !text.trim().is_empty() {
                        break text;
                    }
                }
            }
        };
        let bad = |message: String| TraceError::Line { line, message };
        let header: TraceHeader = serde_json::from_str(&text).map_err(|e| bad(format!("bad header: {e}")))?;
        header.validate().map_err(bad)?;
        Ok(TraceReader { lines, line, header })
    }

    /// The trace's header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<TraceEvent, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.line += 1;
            let text = match self.lines.next()? {
                Ok(text) => text,
                Err(e) => return Some(Err(e.into())),
            };
            if text.trim().is_empty() {
                continue;
            }
            let bad = |message: String| TraceError::Line { line: self.line, message };
            let event: TraceEvent = match serde_json::from_str(&text) {
                Ok(event) => event,
                Err(e) => return Some(Err(bad(e.to_string()))),
            };
            return Some(event.validate(&self.header).map(|()| event).map_err(bad));
        }
    }
}

/// A whole trace in memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Trace {
    /// The header.
    pub header: TraceHeader,
    /// Every event, in order.
    pub events: Vec<TraceEvent>,
}

impl Trace {
    /// Reads a trace file.
    pub fn read(path: &Path) -> Result<Trace, TraceError> {
        Trace::from_reader(TraceReader::open(path)?)
    }

    /// Collects a reader's events.
    pub fn from_reader<R: BufRead>(reader: TraceReader<R>) -> Result<Trace, TraceError> {
        let header = reader.header().clone();
        let events = reader.collect::<Result<_, _>>()?;
        Ok(Trace { header, events })
    }

    /// Writes the trace to `out`.
    pub fn write_to<W: Write>(&self, out: W) -> Result<W, TraceError> {
        let mut w = TraceWriter::new(out, &self.header)?;
        for event in &self.events {
            w.event(event)?;
        }
        w.finish()
    }

    /// Writes the trace to a file.
    pub fn write(&self, path: &Path) -> Result<(), TraceError> {
        let file = File::create(path).map_err(|source| TraceError::Open { path: path.into(), source })?;
        self.write_to(BufWriter::new(file)).map(drop)
    }

    /// Number of requests.
    pub fn requests(&self) -> usize {
        self.events.iter().filter(|e| matches!(e, TraceEvent::Request(_))).count()
    }
}
