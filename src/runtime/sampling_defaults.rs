//! The sampling a model runs with where the caller names none: the model's own recommendation
//! (`generation_config.json`, or a GGUF file's `general.sampling.*` keys) laid over llama.cpp's
//! defaults; and [`SamplingOverrides`], the fields a caller (command-line flags, an HTTP
//! request) sets on top of them.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::penalties::Penalties;
use super::sampler::SamplingParams;
use crate::model::gguf::GgufModel;

/// The file a Hugging Face model states its generation settings in.
pub const GENERATION_CONFIG: &str = "generation_config.json";

impl SamplingParams {
    /// What llama.cpp and Ollama sample with when told nothing: temperature 0.8, top-k 40,
    /// top-p 0.95, min-p 0.05, and Ollama's repetition penalty of 1.1 over the last 64 tokens
    /// (llama.cpp's own default penalty is off since 2024; a small model without one loops).
    /// Seed 0: callers that want a fresh draw each run set one.
    pub fn llama_cpp() -> SamplingParams {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            seed: 0,
            min_p: 0.05,
            penalties: Penalties { repeat: 1.1, last_n: 64, presence: 0.0, frequency: 0.0 },
        }
    }
}

/// Sampling fields a caller sets; `None` leaves the value underneath (the model's default).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplingOverrides {
    /// Temperature (0 = greedy).
    pub temperature: Option<f32>,
    /// Keep the k most likely tokens (0 = all).
    pub top_k: Option<usize>,
    /// Nucleus threshold.
    pub top_p: Option<f32>,
    /// Min-p threshold.
    pub min_p: Option<f32>,
    /// Repetition penalty (1 = off).
    pub repeat_penalty: Option<f32>,
    /// Tokens the penalties look back over.
    pub repeat_last_n: Option<usize>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Random seed.
    pub seed: Option<u64>,
}

impl SamplingOverrides {
    /// `base` with the fields set here replaced. A temperature of 0 set here is plain greedy
    /// decoding: `base`'s penalties are dropped unless set here too (`--temperature 0` is the
    /// argmax, as evaluation harnesses expect, whatever penalty the model recommends).
    pub fn over(&self, base: SamplingParams) -> SamplingParams {
        let p = match self.temperature == Some(0.0) {
            true => Penalties { repeat: 1.0, presence: 0.0, frequency: 0.0, ..base.penalties },
            false => base.penalties,
        };
        SamplingParams {
            temperature: self.temperature.unwrap_or(base.temperature),
            top_k: self.top_k.unwrap_or(base.top_k),
            top_p: self.top_p.unwrap_or(base.top_p),
            seed: self.seed.unwrap_or(base.seed),
            min_p: self.min_p.unwrap_or(base.min_p),
            penalties: Penalties {
                repeat: self.repeat_penalty.unwrap_or(p.repeat),
                last_n: self.repeat_last_n.unwrap_or(p.last_n),
                presence: self.presence_penalty.unwrap_or(p.presence),
                frequency: self.frequency_penalty.unwrap_or(p.frequency),
            },
        }
    }

    /// What a `generation_config.json` object recommends: `temperature`, `top_k`, `top_p`,
    /// `min_p` and `repetition_penalty` where given (as vLLM reads it), and `do_sample: false`
    /// as greedy (transformers' meaning). Transformers' own defaults for absent fields (top-k
    /// 50, temperature 1) are not applied: absent fields keep llama.cpp's.
    pub fn from_generation_config(config: &Value) -> SamplingOverrides {
        let float = |key: &str| config.get(key).and_then(Value::as_f64).map(|v| v as f32);
        let greedy = config.get("do_sample").and_then(Value::as_bool) == Some(false);
        SamplingOverrides {
            temperature: if greedy { Some(0.0) } else { float("temperature") },
            top_k: config.get("top_k").and_then(Value::as_u64).map(|k| k as usize),
            top_p: float("top_p"),
            min_p: float("min_p"),
            repeat_penalty: float("repetition_penalty"),
            ..Default::default()
        }
    }

    /// What a GGUF file's `general.sampling.*` keys recommend (llama.cpp's names: `temp`,
    /// `top_k`, `top_p`, `min_p`, `penalty_repeat`, `penalty_last_n`).
    pub fn from_gguf(gguf: &GgufModel) -> SamplingOverrides {
        let float = |key: &str| gguf.get(&format!("general.sampling.{key}")).and_then(|v| v.as_f64()).map(|v| v as f32);
        let count =
            |key: &str| gguf.get(&format!("general.sampling.{key}")).and_then(|v| v.as_u64()).map(|v| v as usize);
        SamplingOverrides {
            temperature: float("temp"),
            top_k: count("top_k"),
            top_p: float("top_p"),
            min_p: float("min_p"),
            repeat_penalty: float("penalty_repeat"),
            repeat_last_n: count("penalty_last_n"),
            ..Default::default()
        }
    }

    /// The model's defaults: these recommendations (read from `source`, named in warnings) over
    /// [`SamplingParams::llama_cpp`], each field kept only where it passes the sampler's checks
    /// (a bad one is warned about and left at llama.cpp's value, so the model still loads and
    /// flags can override it).
    pub fn model_defaults(&self, source: &str) -> SamplingParams {
        let base = SamplingParams::llama_cpp();
        let mut out = base;
        let fields: [SamplingOverrides; 6] = [
            SamplingOverrides { temperature: self.temperature, ..Default::default() },
            SamplingOverrides { top_k: self.top_k, ..Default::default() },
            SamplingOverrides { top_p: self.top_p, ..Default::default() },
            SamplingOverrides { min_p: self.min_p, ..Default::default() },
            SamplingOverrides { repeat_penalty: self.repeat_penalty, ..Default::default() },
            SamplingOverrides { repeat_last_n: self.repeat_last_n, ..Default::default() },
        ];
        for field in fields {
            let candidate = field.over(out);
            match candidate.validate() {
                Ok(()) => out = candidate,
                Err(e) => log::warn!("{source}: ignoring its sampling recommendation: {e}"),
            }
        }
        out
    }
}

/// A seed for a caller that named none: different on every call (the time and a counter), as
/// llama.cpp's seed -1.
pub fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(32)
}

/// The sampling defaults of the model in `dir` (its `generation_config.json`; absent or
/// unreadable, llama.cpp's defaults, with a warning for a file that does not parse).
pub fn from_model_dir(dir: &Path) -> SamplingParams {
    let path = dir.join(GENERATION_CONFIG);
    let Ok(text) = std::fs::read_to_string(&path) else { return SamplingParams::llama_cpp() };
    match serde_json::from_str::<Value>(&text) {
        Ok(config) => SamplingOverrides::from_generation_config(&config).model_defaults(&path.display().to_string()),
        Err(e) => {
            log::warn!("{}: not JSON ({e}); sampling with llama.cpp's defaults", path.display());
            SamplingParams::llama_cpp()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generation_config_fields_lie_over_llama_cpp_defaults() {
        let qwen3 = json!({"do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": [1, 2]});
        let p = SamplingOverrides::from_generation_config(&qwen3).model_defaults("x");
        assert_eq!((p.temperature, p.top_k, p.top_p, p.min_p), (0.6, 20, 0.95, 0.05));
        assert_eq!(p.penalties.repeat, 1.1);
        // `do_sample: false` is greedy whatever the temperature says.
        let greedy = json!({"do_sample": false, "temperature": 0.7, "repetition_penalty": 1.3});
        let p = SamplingOverrides::from_generation_config(&greedy).model_defaults("x");
        assert!(p.is_greedy());
        assert_eq!(p.penalties.repeat, 1.3);
        // Nothing stated: llama.cpp's.
        assert_eq!(
            SamplingOverrides::from_generation_config(&json!({})).model_defaults("x"),
            SamplingParams::llama_cpp()
        );
    }

    #[test]
    fn a_bad_recommendation_is_dropped_field_by_field() {
        let bad = json!({"temperature": -1.0, "top_p": 0.0, "min_p": 0.1, "repetition_penalty": 0.0});
        let p = SamplingOverrides::from_generation_config(&bad).model_defaults("x");
        let d = SamplingParams::llama_cpp();
        assert_eq!((p.temperature, p.top_p, p.penalties.repeat), (d.temperature, d.top_p, d.penalties.repeat));
        assert_eq!(p.min_p, 0.1);
        p.validate().unwrap();
    }

    #[test]
    fn overrides_replace_only_what_they_set() {
        let o =
            SamplingOverrides { temperature: Some(0.0), seed: Some(9), repeat_last_n: Some(8), ..Default::default() };
        let p = o.over(SamplingParams::llama_cpp());
        assert_eq!((p.temperature, p.seed, p.penalties.last_n, p.top_k), (0.0, 9, 8, 40));
        assert_eq!(SamplingOverrides::default().over(SamplingParams::llama_cpp()), SamplingParams::llama_cpp());
        // A caller's temperature 0 is the plain argmax unless it names a penalty too.
        let greedy =
            SamplingOverrides { temperature: Some(0.0), ..Default::default() }.over(SamplingParams::llama_cpp());
        assert!(greedy.argmax_on_gpu());
        let penalised = SamplingOverrides { temperature: Some(0.0), repeat_penalty: Some(1.1), ..Default::default() };
        assert_eq!(penalised.over(SamplingParams::llama_cpp()).penalties.repeat, 1.1);
    }
}
