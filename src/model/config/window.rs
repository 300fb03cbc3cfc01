//! Sliding-window attention: which layers attend only to their last `window` keys, read the
//! way transformers 5 derives it for each family.
//!
//! A windowed query at position `p` sees keys `p + 1 - window ..= p` (transformers'
//! `sliding_window_overlay`: `kv_idx > q_idx - sliding_window`), so `window` keys including
//! its own.
//!
//! - Mixtral: every layer, when `sliding_window` is set.
//! - Qwen3-MoE: every layer, when `use_sliding_window` (window `sliding_window`, default 4096).
//! - Qwen2, Qwen3: `layer_types` when given, else layers `>= max_window_layers` (default 28),
//!   when `use_sliding_window`.
//! - Qwen2-MoE: `layer_types` when given, else even layers `< max_window_layers` (default 28),
//!   when `use_sliding_window`.
//!
//! - gpt-oss: `layer_types` when given, else even layers (transformers' default alternation),
//!   window `sliding_window` (default 128); there is no `use_sliding_window` flag.
//!
//! A `sliding_attention` layer without a window (`use_sliding_window` false or no positive
//! `sliding_window`) and any other layer type are refused by name.

use serde_json::Value;

use super::fields::{bool_field, get, opt_usize};
use super::Family;
use crate::error::{Error, Result};

/// Transformers' default `sliding_window` for the Qwen families.
const QWEN_DEFAULT_WINDOW: usize = 4096;
/// Transformers' default `sliding_window` for gpt-oss.
const GPT_OSS_DEFAULT_WINDOW: usize = 128;
/// Transformers' default `max_window_layers` for the Qwen families.
const QWEN_DEFAULT_MAX_WINDOW_LAYERS: usize = 28;

/// Each layer's window (`None`: full causal attention); empty when no layer is windowed.
pub(super) fn parse(cfg: &Value, family: Family, layers: usize) -> Result<Vec<Option<usize>>> {
    let windowed: Vec<bool> = match family {
        Family::Mixtral => vec![get(cfg, "sliding_window").is_some(); layers],
        Family::Qwen3Moe => vec![bool_field(cfg, "use_sliding_window", false)?; layers],
        Family::Qwen2 | Family::Qwen3 | Family::Qwen2Moe => qwen_layer_types(cfg, family, layers)?,
        Family::GptOss => match get(cfg, "layer_types") {
            Some(types) => layer_types(types, layers)?,
            None => (0..layers).map(|i| i % 2 == 0).collect(),
        },
        _ => return Ok(Vec::new()),
    };
    if !windowed.contains(&true) {
        return Ok(Vec::new());
    }
    // transformers drops the window unless `use_sliding_window` (Mixtral has no such flag);
    // the Qwen configs default an absent `sliding_window` to 4096.
    let own_rule = matches!(family, Family::Mixtral | Family::GptOss);
    let used = own_rule || bool_field(cfg, "use_sliding_window", false)?;
    let window = match cfg.get("sliding_window") {
        None if family == Family::GptOss => Some(GPT_OSS_DEFAULT_WINDOW),
        None if family != Family::Mixtral => Some(QWEN_DEFAULT_WINDOW),
        _ => opt_usize(cfg, "sliding_window")?,
    };
    let window = window.filter(|&w| used && w > 0).ok_or_else(|| {
        Error::UnsupportedConfig(format!(
            "sliding_attention layers without a window (use_sliding_window {used}, sliding_window {window:?})"
        ))
    })?;
    Ok(windowed.into_iter().map(|w| w.then_some(window)).collect())
}

/// Whether each layer is `sliding_attention`: the config's `layer_types`, else the family's rule.
fn qwen_layer_types(cfg: &Value, family: Family, layers: usize) -> Result<Vec<bool>> {
    if let Some(types) = get(cfg, "layer_types") {
        return layer_types(types, layers);
    }
    if !bool_field(cfg, "use_sliding_window", false)? {
        return Ok(vec![false; layers]);
    }
    let max_window_layers = opt_usize(cfg, "max_window_layers")?.unwrap_or(QWEN_DEFAULT_MAX_WINDOW_LAYERS);
    Ok((0..layers)
        .map(|i| match family {
            Family::Qwen2Moe => i % 2 == 0 && i < max_window_layers,
            _ => i >= max_window_layers,
        })
        .collect())
}

/// Whether each layer of a `layer_types` list is `sliding_attention` (`full_attention` the
/// other; any other entry is refused by name).
fn layer_types(types: &Value, layers: usize) -> Result<Vec<bool>> {
    let types = types.as_array().ok_or_else(|| Error::ConfigField("layer_types".into()))?;
    if types.len() != layers {
        return Err(Error::ConfigValue {
            field: "layer_types".into(),
            value: format!("{} entries", types.len()),
            expected: format!("one per layer ({layers})"),
        });
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            Some("full_attention") => Ok(false),
            Some("sliding_attention") => Ok(true),
            _ => Err(Error::UnsupportedConfig(format!("layer_types entry {t} is not implemented"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qwen2_windows_layers_from_max_window_layers() {
        let cfg = json!({"use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1});
        assert_eq!(parse(&cfg, Family::Qwen2, 3).unwrap(), vec![None, Some(8), Some(8)]);
    }

    #[test]
    fn qwen2_moe_windows_even_layers_below_max_window_layers() {
        let cfg = json!({"use_sliding_window": true, "sliding_window": 8, "max_window_layers": 3});
        assert_eq!(parse(&cfg, Family::Qwen2Moe, 4).unwrap(), vec![Some(8), None, Some(8), None]);
    }

    #[test]
    fn unused_window_is_no_window() {
        let cfg = json!({"use_sliding_window": false, "sliding_window": 4096});
        assert!(parse(&cfg, Family::Qwen3Moe, 2).unwrap().is_empty());
        assert!(parse(&json!({"sliding_window": null}), Family::Mixtral, 2).unwrap().is_empty());
        assert_eq!(parse(&json!({"sliding_window": 5}), Family::Mixtral, 2).unwrap(), vec![Some(5), Some(5)]);
    }

    #[test]
    fn gpt_oss_alternates_by_default() {
        let cfg = json!({"sliding_window": 8});
        assert_eq!(parse(&cfg, Family::GptOss, 3).unwrap(), vec![Some(8), None, Some(8)]);
        let cfg = json!({"layer_types": ["full_attention", "sliding_attention"]});
        assert_eq!(parse(&cfg, Family::GptOss, 2).unwrap(), vec![None, Some(128)]);
        let cfg = json!({"layer_types": ["sliding_attention", "linear_attention"]});
        assert!(parse(&cfg, Family::GptOss, 2).is_err());
    }

    #[test]
    fn sliding_layer_without_window_is_refused() {
        let cfg = json!({"use_sliding_window": false, "layer_types": ["sliding_attention", "full_attention"]});
        assert!(parse(&cfg, Family::Qwen3, 2).is_err());
        let cfg = json!({"layer_types": ["chunked_attention", "full_attention"]});
        assert!(parse(&cfg, Family::Qwen3, 2).is_err());
    }
}
