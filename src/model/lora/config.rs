//! `adapter_config.json` of a PEFT LoRA adapter: rank, scale and target modules, refusing the
//! options moestream does not implement (DoRA, transposed weights, biases, per-module ranks).

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// Largest rank accepted (above every hidden size [`crate::model::config_limits::MAX_HIDDEN`]
/// allows a projection to have; the GPU keeps a `[max_batch, r]` buffer).
pub const MAX_RANK: usize = crate::model::config_limits::MAX_HIDDEN;

/// Largest scale magnitude accepted. Published adapters use 0.5–4 (`lora_alpha` about 2r;
/// rsLoRA's `alpha / sqrt(r)` a few tens); far beyond, the f32 deltas overflow into NaN.
pub const MAX_SCALE: f64 = 1e4;

/// The file naming the adapter's hyper-parameters.
pub const CONFIG_FILE: &str = "adapter_config.json";

/// `target_modules`: a list of module-name suffixes, or one regular expression (or
/// `all-linear`), which is not checked against the tensors.
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
enum TargetModules {
    List(Vec<String>),
    Pattern(String),
}

#[derive(Deserialize, Debug)]
struct RawConfig {
    #[serde(default)]
    peft_type: Option<String>,
    r: usize,
    lora_alpha: f64,
    target_modules: TargetModules,
    #[serde(default)]
    use_rslora: bool,
    #[serde(default)]
    fan_in_fan_out: bool,
    #[serde(default)]
    use_dora: Option<bool>,
    #[serde(default)]
    bias: Option<String>,
    #[serde(default)]
    rank_pattern: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    alpha_pattern: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The parts of an adapter's configuration that change the computation.
#[derive(Clone, Debug)]
pub struct AdapterConfig {
    /// Rank `r` of every pair.
    pub rank: usize,
    /// `lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora`.
    pub scale: f32,
    /// Module-name suffixes the adapter targets; `None` when given as a pattern.
    target_modules: Option<Vec<String>>,
}

impl AdapterConfig {
    /// Reads and checks `dir/adapter_config.json`.
    pub fn load(dir: &Path) -> Result<AdapterConfig> {
        let path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let raw: RawConfig =
            serde_json::from_str(&text).map_err(|e| Error::Json { path: path.clone(), message: e.to_string() })?;
        let refuse = |message: String| Err(Error::Lora { path: path.clone(), message });
        if let Some(t) = raw.peft_type.as_deref().filter(|t| !t.eq_ignore_ascii_case("LORA")) {
            return refuse(format!("peft_type {t:?} is not LORA"));
        }
        if raw.r == 0 {
            return refuse("r must be at least 1".into());
        }
        if raw.fan_in_fan_out {
            return refuse("fan_in_fan_out = true (transposed weights, GPT-2 style) is not supported".into());
        }
        if raw.use_dora == Some(true) {
            return refuse("use_dora = true (DoRA) is not supported".into());
        }
        if let Some(b) = raw.bias.as_deref().filter(|b| *b != "none") {
            return refuse(format!("bias = {b:?} is not supported (only \"none\")"));
        }
        for (field, map) in [("rank_pattern", &raw.rank_pattern), ("alpha_pattern", &raw.alpha_pattern)] {
            if map.as_ref().is_some_and(|m| !m.is_empty()) {
                return refuse(format!("{field} is not supported (one rank and alpha for every module)"));
            }
        }
        let r = raw.r as f64;
        let scale = if raw.use_rslora { raw.lora_alpha / r.sqrt() } else { raw.lora_alpha / r };
        if raw.r > MAX_RANK {
            return refuse(format!("r = {} is above {MAX_RANK}", raw.r));
        }
        if !scale.is_finite() || scale.abs() > MAX_SCALE {
            return refuse(format!("lora_alpha = {} gives the scale {scale}, beyond ±{MAX_SCALE}", raw.lora_alpha));
        }
        let target_modules = match raw.target_modules {
            TargetModules::List(l) => Some(l),
            TargetModules::Pattern(p) => {
                log::info!("{}: target_modules is the pattern {p:?}, not checked against the tensors", path.display());
                None
            }
        };
        Ok(AdapterConfig { rank: raw.r, scale: scale as f32, target_modules })
    }

    /// Whether `module` (a full module path) is one `target_modules` names, the way PEFT
    /// matches them: equal, or ending in `.` + the entry. Always true for a pattern.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.as_ref().is_none_or(|list| {
            list.iter().any(|t| module == t || module.strip_suffix(t.as_str()).is_some_and(|p| p.ends_with('.')))
        })
    }
}
