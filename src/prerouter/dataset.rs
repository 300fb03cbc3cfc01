//! The prerouter's training data on disk, written token by token and read back checked.
//!
//! A dataset is a directory of three files:
//!
//! | file | contents |
//! | --- | --- |
//! | `meta.json` | [`DatasetMeta`]: format version, token count, dimensions, MoE layer indices, window |
//! | `hidden.f32` | `tokens × moe_layers × hidden` f32, little-endian, token-major: for each token, each MoE layer's FFN input (the post-attention RMSNorm output `hn`) |
//! | `topk.u16` | `tokens × moe_layers × top_k` u16, little-endian, same order: each MoE layer's routed expert ids, in the router's rank order |
//! | `tokens.u32` | `tokens` u32, little-endian: each token's id (from version 2; version 1 datasets have none) |
//!
//! Tokens come from teacher-forced sequences of `window` tokens each: token `t` starts a new
//! sequence when `t % window == 0`, so no sample pairs tokens of two sequences.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::compat::ModelDims;
use super::error::PrerouterError;
use crate::model::config_limits::{MAX_HIDDEN, MAX_LAYERS};

/// Name of the metadata file.
pub const META_FILE: &str = "meta.json";
/// Name of the hidden-state file.
pub const HIDDEN_FILE: &str = "hidden.f32";
/// Name of the routed-ids file.
pub const TOPK_FILE: &str = "topk.u16";
/// Name of the token-ids file.
pub const TOKENS_FILE: &str = "tokens.u32";
/// Version written into `meta.json` (version 1, without token ids, is read too).
pub const FORMAT_VERSION: u32 = 2;

type Result<T> = std::result::Result<T, PrerouterError>;

/// `meta.json`: what the two data files hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetMeta {
    /// [`FORMAT_VERSION`].
    pub version: u32,
    /// Tokens recorded.
    pub tokens: usize,
    /// Model hidden size (floats per layer per token in `hidden.f32`).
    pub hidden: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts each token is routed to (ids per layer per token in `topk.u16`).
    pub top_k: usize,
    /// Model layer index of each recorded MoE layer, in order.
    pub moe_layers: Vec<usize>,
    /// Tokens per teacher-forced sequence.
    pub window: usize,
}

impl DatasetMeta {
    /// The dimensions of the model the data was collected from.
    pub fn dims(&self) -> ModelDims {
        ModelDims { hidden: self.hidden, experts: self.experts, top_k: self.top_k, moe_layers: self.moe_layers.clone() }
    }

    /// Floats of one token's hidden states (all MoE layers).
    pub fn hidden_per_token(&self) -> usize {
        self.moe_layers.len() * self.hidden
    }

    /// Ids of one token's routing (all MoE layers).
    pub fn ids_per_token(&self) -> usize {
        self.moe_layers.len() * self.top_k
    }

    fn check(&self, path: &Path) -> Result<()> {
        let bad = |d: String| Err(PrerouterError::corrupt(path, d));
        if !(1..=FORMAT_VERSION).contains(&self.version) {
            return bad(format!("format version {} (this build reads {FORMAT_VERSION})", self.version));
        }
        if self.hidden == 0 || self.experts == 0 || self.window == 0 || self.moe_layers.is_empty() {
            return bad("hidden, experts, window and moe_layers must be non-empty".into());
        }
        if self.top_k == 0 || self.top_k > self.experts || self.experts > usize::from(u16::MAX) {
            return bad(format!("top_k {} of {} experts", self.top_k, self.experts));
        }
        if self.hidden > MAX_HIDDEN || self.moe_layers.len() > MAX_LAYERS {
            return bad(format!(
                "hidden {} (at most {MAX_HIDDEN}) or {} MoE layers (at most {MAX_LAYERS})",
                self.hidden,
                self.moe_layers.len()
            ));
        }
        Ok(())
    }
}

/// Streams tokens into a dataset directory; memory stays one token's worth.
pub struct DatasetWriter {
    dir: PathBuf,
    meta: DatasetMeta,
    hidden: BufWriter<File>,
    topk: BufWriter<File>,
    tokens: BufWriter<File>,
}

fn create(path: PathBuf) -> Result<BufWriter<File>> {
    File::create(&path).map(BufWriter::new).map_err(|e| PrerouterError::io(path, e))
}

impl DatasetWriter {
    /// Creates `dir` (if needed) and empty data files; `meta.tokens` is ignored (counted).
    pub fn create(dir: &Path, meta: DatasetMeta) -> Result<DatasetWriter> {
        std::fs::create_dir_all(dir).map_err(|e| PrerouterError::io(dir, e))?;
        let meta = DatasetMeta { tokens: 0, version: FORMAT_VERSION, ..meta };
        meta.check(&dir.join(META_FILE))?;
        Ok(DatasetWriter {
            hidden: create(dir.join(HIDDEN_FILE))?,
            topk: create(dir.join(TOPK_FILE))?,
            tokens: create(dir.join(TOKENS_FILE))?,
            dir: dir.to_path_buf(),
            meta,
        })
    }

    /// The metadata so far.
    pub fn meta(&self) -> &DatasetMeta {
        &self.meta
    }

    /// Appends one token: its id, `hidden` (moe_layers × hidden) and `ids` (moe_layers × top_k).
    pub fn push(&mut self, token: u32, hidden: &[f32], ids: &[u16]) -> Result<()> {
        if hidden.len() != self.meta.hidden_per_token() || ids.len() != self.meta.ids_per_token() {
            return Err(PrerouterError::InvalidArgument(format!(
                "a token holds {} floats and {} ids, got {} and {}",
                self.meta.hidden_per_token(),
                self.meta.ids_per_token(),
                hidden.len(),
                ids.len()
            )));
        }
        let h: Vec<u8> = hidden.iter().flat_map(|v| v.to_le_bytes()).collect();
        let k: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.hidden.write_all(&h).map_err(|e| PrerouterError::io(self.dir.join(HIDDEN_FILE), e))?;
        self.topk.write_all(&k).map_err(|e| PrerouterError::io(self.dir.join(TOPK_FILE), e))?;
        self.tokens.write_all(&token.to_le_bytes()).map_err(|e| PrerouterError::io(self.dir.join(TOKENS_FILE), e))?;
        self.meta.tokens += 1;
        Ok(())
    }

    /// Flushes the data files and writes `meta.json`; returns the final metadata.
    pub fn finish(mut self) -> Result<DatasetMeta> {
        self.hidden.flush().map_err(|e| PrerouterError::io(self.dir.join(HIDDEN_FILE), e))?;
        self.topk.flush().map_err(|e| PrerouterError::io(self.dir.join(TOPK_FILE), e))?;
        self.tokens.flush().map_err(|e| PrerouterError::io(self.dir.join(TOKENS_FILE), e))?;
        let path = self.dir.join(META_FILE);
        let json = serde_json::to_string_pretty(&self.meta).expect("serialisable");
        std::fs::write(&path, json).map_err(|e| PrerouterError::io(path, e))?;
        Ok(self.meta)
    }
}

/// A dataset read into memory, every size and id checked.
pub struct Dataset {
    /// What the files hold.
    pub meta: DatasetMeta,
    hidden: Vec<f32>,
    topk: Vec<u16>,
    /// Each token's id (empty in a version 1 dataset).
    tokens: Vec<u32>,
}

fn read_exact_len(path: &Path, expected: usize) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).map_err(|e| PrerouterError::io(path, e))?;
    if bytes.len() != expected {
        return Err(PrerouterError::corrupt(path, format!("{} bytes, meta.json implies {expected}", bytes.len())));
    }
    Ok(bytes)
}

impl Dataset {
    /// Reads the dataset in `dir`.
    pub fn open(dir: &Path) -> Result<Dataset> {
        let meta_path = dir.join(META_FILE);
        let text = std::fs::read_to_string(&meta_path).map_err(|e| PrerouterError::io(&meta_path, e))?;
        let meta: DatasetMeta =
            serde_json::from_str(&text).map_err(|e| PrerouterError::corrupt(&meta_path, e.to_string()))?;
        meta.check(&meta_path)?;
        let bytes = |per_token: usize, width: usize| {
            meta.tokens.checked_mul(per_token).and_then(|n| n.checked_mul(width)).ok_or_else(|| {
                PrerouterError::corrupt(&meta_path, format!("{} tokens × {per_token} values overflow", meta.tokens))
            })
        };
        let hidden_path = dir.join(HIDDEN_FILE);
        let hidden: Vec<f32> = read_exact_len(&hidden_path, bytes(meta.hidden_per_token(), 4)?)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        if hidden.iter().any(|v| !v.is_finite()) {
            return Err(PrerouterError::corrupt(hidden_path, "non-finite hidden state"));
        }
        let topk_path = dir.join(TOPK_FILE);
        let topk: Vec<u16> = read_exact_len(&topk_path, bytes(meta.ids_per_token(), 2)?)?
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        if let Some(bad) = topk.iter().find(|&&e| usize::from(e) >= meta.experts) {
            return Err(PrerouterError::corrupt(topk_path, format!("expert id {bad} of {} experts", meta.experts)));
        }
        let tokens = match meta.version {
            1 => Vec::new(),
            _ => read_exact_len(&dir.join(TOKENS_FILE), bytes(1, 4)?)?
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        };
        Ok(Dataset { meta, hidden, topk, tokens })
    }

    /// Token `t`'s id, when the dataset records them (version 2 on).
    pub fn token(&self, t: usize) -> Option<u32> {
        self.tokens.get(t).copied()
    }

    /// MoE layer `j`'s FFN input at token `t` (`j` indexes `meta.moe_layers`).
    pub fn hidden(&self, t: usize, j: usize) -> &[f32] {
        let h = self.meta.hidden;
        let start = (t * self.meta.moe_layers.len() + j) * h;
        &self.hidden[start..start + h]
    }

    /// MoE layer `j`'s routed ids at token `t`.
    pub fn topk(&self, t: usize, j: usize) -> &[u16] {
        let k = self.meta.top_k;
        let start = (t * self.meta.moe_layers.len() + j) * k;
        &self.topk[start..start + k]
    }

    /// Whether token `t` is the first of its teacher-forced sequence.
    pub fn starts_sequence(&self, t: usize) -> bool {
        t.is_multiple_of(self.meta.window)
    }
}
