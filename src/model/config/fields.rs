//! Typed reads of `config.json` fields: a present field of the wrong type is an error naming it.

use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::config_limits::check_field;

/// `cfg[key]`, treating JSON `null` as absent.
pub(super) fn get<'a>(cfg: &'a Value, key: &str) -> Option<&'a Value> {
    cfg.get(key).filter(|v| !v.is_null())
}

/// A required non-negative integer.
pub(super) fn usize_field(cfg: &Value, key: &str) -> Result<usize> {
    opt_usize(cfg, key)?.ok_or_else(|| Error::ConfigField(key.into()))
}

/// An optional non-negative integer, within the bounds `config_limits` names for `key`.
pub(super) fn opt_usize(cfg: &Value, key: &str) -> Result<Option<usize>> {
    get(cfg, key).map(|v| check_field(key, v)).transpose()
}

/// An optional number, `default` when absent.
pub(super) fn f32_field(cfg: &Value, key: &str, default: f32) -> Result<f32> {
    Ok(obj_f32(cfg, key, key)?.unwrap_or(default))
}

/// An optional boolean, `default` when absent.
pub(super) fn bool_field(cfg: &Value, key: &str, default: bool) -> Result<bool> {
    match get(cfg, key) {
        None => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| Error::ConfigField(key.into())),
    }
}

/// An optional string.
pub(super) fn opt_str<'a>(cfg: &'a Value, key: &str) -> Result<Option<&'a str>> {
    get(cfg, key).map(|v| v.as_str().ok_or_else(|| Error::ConfigField(key.into()))).transpose()
}

/// An optional number of object `obj`; errors name it `what`.
pub(super) fn obj_f32(obj: &Value, key: &str, what: &str) -> Result<Option<f32>> {
    get(obj, key).map(|v| v.as_f64().map(|v| v as f32).ok_or_else(|| Error::ConfigField(what.into()))).transpose()
}

/// An optional non-negative integer of object `obj`.
pub(super) fn obj_usize(obj: &Value, key: &str) -> Result<Option<usize>> {
    get(obj, key).map(|v| v.as_u64().map(|v| v as usize).ok_or_else(|| Error::ConfigField(key.into()))).transpose()
}
