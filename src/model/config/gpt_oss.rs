//! gpt-oss's config defaults, as transformers' `GptOssConfig` fills them in: a config without a
//! RoPE block gets YaRN ×32 from 4096 (`beta_fast` 32, `beta_slow` 1, `truncate` false).

use serde_json::{json, Value};

use super::rope::rope_object;

/// `cfg` with transformers' default RoPE block when it has none.
pub(super) fn with_defaults(cfg: &Value) -> Value {
    let mut cfg = cfg.clone();
    if rope_object(&cfg).is_none() {
        if let Some(obj) = cfg.as_object_mut() {
            obj.insert(
                "rope_scaling".into(),
                json!({
                    "rope_type": "yarn",
                    "factor": 32.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "truncate": false,
                    "original_max_position_embeddings": 4096
                }),
            );
        }
    }
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_rope_is_yarn() {
        let cfg = with_defaults(&json!({"rope_theta": 150000}));
        assert_eq!(cfg["rope_scaling"]["rope_type"], "yarn");
        let given = json!({"rope_scaling": {"rope_type": "default"}});
        assert_eq!(with_defaults(&given), given);
    }
}
