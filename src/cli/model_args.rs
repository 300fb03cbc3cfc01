//! Flags shared by the subcommands that load a model.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use moestream::gpu::GpuOptions;
use moestream::ops::WeightFormat;
use moestream::runtime::EngineOptions;
use moestream::{Engine, Error, Result};

/// Weight precision on the GPU.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Dtype {
    /// 32-bit floats: exact comparison with the reference.
    F32,
    /// 16-bit floats (default).
    F16,
}

/// Where the model is and how to run it.
#[derive(Args, Debug)]
pub struct ModelArgs {
    /// Model directory (Hugging Face layout); defaults to the bundled model.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Weight precision on the GPU.
    #[arg(long, value_enum, default_value = "f16")]
    pub dtype: Dtype,
    /// KV-cache length in tokens (default: the model's maximum, at most 4096).
    #[arg(long)]
    pub context: Option<usize>,
    /// GPU adapter by name substring or index (see `moestream devices`); env MOESTREAM_ADAPTER.
    #[arg(long)]
    pub adapter: Option<String>,
}

/// The bundled model's directory: `$MOESTREAM_MODEL`, else `models/moestream-tiny-moe` in the
/// source tree this binary was built from.
pub fn default_model() -> PathBuf {
    std::env::var_os("MOESTREAM_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/moestream-tiny-moe"))
}

impl ModelArgs {
    /// The model directory to use.
    pub fn dir(&self) -> PathBuf {
        self.model.clone().unwrap_or_else(default_model)
    }

    /// Loads the engine these flags describe.
    pub fn load(&self) -> Result<Engine> {
        let dir = self.dir();
        if !dir.join("config.json").exists() {
            return Err(Error::InvalidArgument(format!(
                "{} is not a model directory (no config.json); pass --model DIR",
                dir.display()
            )));
        }
        let format = match self.dtype {
            Dtype::F32 => WeightFormat::F32,
            Dtype::F16 => WeightFormat::F16,
        };
        let mut o = EngineOptions::new(dir).with_format(format);
        o.context = self.context;
        o.gpu = GpuOptions { adapter: self.adapter.clone(), ..Default::default() };
        Engine::load(&o)
    }
}

/// Parses `1,2,3` into token ids.
pub fn parse_tokens(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|t| t.trim().parse::<u32>().map_err(|_| Error::InvalidArgument(format!("bad token id {t:?} in --tokens"))))
        .collect()
}
