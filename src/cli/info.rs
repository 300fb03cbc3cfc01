//! `moestream info`.

use clap::Args;

use super::model_args::{check_exists, default_model};
use moestream::model::gguf::GgufModel;
use moestream::model::{ArchSpec, AttentionKind, CacheShape, Checkpoint, LinearKind, MlaCacheKind};
use moestream::ops::KvDtype;
use moestream::prerouter::heads_file::{Heads, HEADS_FILE};
use moestream::runtime::options::DEFAULT_MAX_BATCH;
use moestream::{Error, Result};

/// Flags of `info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Model directory, GGUF file or MLX directory; defaults to the bundled model.
    #[arg(short, long)]
    model: Option<std::path::PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// What the KV cache holds per token and layer.
fn kv_cache_kind(spec: &ArchSpec) -> String {
    match spec.mla() {
        Some(m) => {
            format!("MLA latent: kv_lora_rank {} + qk_rope_head_dim {}", m.kv_lora_rank, m.qk_rope_head_dim)
        }
        None => format!("keys and values: 2 x {} KV heads x head_dim {}", spec.kv_heads, spec.head_dim),
    }
}

/// KV bytes per token (f16) of an MLA model with `--mla-cache decompressed`.
fn decompressed_kv_f16(spec: &ArchSpec) -> Option<u64> {
    let mut d = spec.clone();
    match &mut d.attention {
        AttentionKind::Mla(m) => m.cache = MlaCacheKind::Decompressed,
        AttentionKind::Grouped => return None,
    }
    Some(d.kv_bytes_per_token(KvDtype::F16, true))
}

/// How a hybrid model's linear-attention layers are named for users.
fn linear_kind_name(kind: LinearKind) -> &'static str {
    match kind {
        LinearKind::GatedDeltaNet => "Gated DeltaNet",
        LinearKind::Kda { .. } => "KDA (Kimi Delta Attention)",
    }
}

/// Runs `info`.
pub fn run(a: InfoArgs) -> Result<()> {
    let dir = a.model.unwrap_or_else(default_model);
    check_exists(&dir)?;
    // A GGUF file's converted directory (`convert FILE.gguf OUT`: model.json and experts.bin)
    // describes that file, whose other tensors it reads.
    let source = match moestream::convert::is_converted(&dir) {
        true => moestream::convert::ModelManifest::load(&dir)?.gguf.unwrap_or_else(|| dir.clone()),
        false => dir.clone(),
    };
    let (spec, ckpt) = match moestream::model::gguf::arch::is_gguf(&source) {
        true => {
            let gguf = GgufModel::open(&source)?;
            let spec = moestream::model::gguf::arch::spec_from_gguf(&gguf)?;
            let ckpt = Checkpoint::from_gguf(gguf, &spec)?;
            (spec, ckpt)
        }
        false => (ArchSpec::from_dir(&dir)?, Checkpoint::open(&dir)?),
    };
    // Whether its MTP module runs here (and why not).
    let mtp = moestream::model::mtp::available(&ckpt, &spec).map_err(|e| match e {
        Error::UnsupportedConfig(why) => why,
        e => e.to_string(),
    });
    let moe_layers = spec.moe_layers.iter().filter(|m| **m).count();
    let experts = spec.moe.as_ref().map_or(0, |m| m.num_experts);
    let expert_params = spec.expert_params();
    // MXFP4 experts (gpt-oss) are stored and streamed as they are: 17 bytes per 32 weights.
    let mxfp4_per_expert =
        moestream::model::gpt_oss_weights::experts_are_mxfp4(&ckpt, &spec).then_some(expert_params / 32 * 17);
    // Shipped prerouter heads: which layers have one and their held-out recall.
    let heads_path = dir.join(HEADS_FILE);
    let heads = heads_path.exists().then(|| Heads::load(&heads_path)).transpose()?;
    let recall = heads
        .as_ref()
        .and_then(|h| h.metrics.as_deref())
        .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok().and_then(|v| v["mean_recall"].as_f64()));
    let [kv_f16, kv_f32, kv_q8, kv_q4] =
        [KvDtype::F16, KvDtype::F32, KvDtype::Q8_0, KvDtype::Q4_0].map(|d| spec.kv_bytes_per_token(d, true));
    // One sequence at the model's maximum context, with the default sliding-window rings and
    // with every position kept (`--swa-full`).
    let longest =
        CacheShape { context: spec.max_positions, max_step: DEFAULT_MAX_BATCH, rings: true, state_copy: false };
    let at_max = spec.kv_cache_bytes(longest, KvDtype::F16);
    let at_max_full = spec.kv_cache_bytes(CacheShape { rings: false, ..longest }, KvDtype::F16);
    let linear_layers = (0..spec.layers).filter(|&i| spec.is_linear_layer(i)).count();
    let info = serde_json::json!({
        "architecture": spec.family.hf_name(),
        "spec": spec,
        "checkpoint_bytes": ckpt.stored_bytes(),
        "kv_cache": kv_cache_kind(&spec),
        "max_context": spec.max_positions,
        "kv_bytes_per_token_f16": kv_f16,
        "kv_bytes_per_token_f32": kv_f32,
        "kv_bytes_per_token_q8_0": kv_q8,
        "kv_bytes_per_token_q4_0": kv_q4,
        "kv_bytes_per_token_decompressed_f16": decompressed_kv_f16(&spec),
        "kv_bytes_per_sequence_at_max_f16": at_max,
        "kv_bytes_per_sequence_at_max_f16_swa_full": at_max_full,
        "linear_attention": spec.hybrid.as_ref().map(|h| serde_json::json!({
            "kind": linear_kind_name(h.kind),
            "layers": linear_layers,
            "state_bytes_per_sequence": spec.linear_state_bytes(),
        })),
        "mtp_layers": spec.mtp_layers,
        "mtp_runs": mtp.is_ok(),
        "moe_layers": moe_layers,
        "experts_per_layer": experts,
        "params_per_expert": expert_params,
        "bytes_per_expert_f16": expert_params * 2,
        "expert_bytes_total_f16": expert_params * 2 * experts * moe_layers,
        "bytes_per_expert_mxfp4": mxfp4_per_expert,
        "prerouter": heads.as_ref().map(|h| serde_json::json!({
            "file": heads_path,
            "head_layers": h.config.heads,
            "features": h.config.features.to_string(),
            "inner": h.config.inner,
            "mean_recall": recall,
        })),
    });
    let windowed: Vec<String> = (0..spec.layers).filter_map(|i| spec.window(i).map(|w| format!("{i}: {w}"))).collect();
    if a.json {
        println!("{info:#}");
    } else {
        println!("architecture      {}", spec.family.hf_name());
        println!("layers            {} ({} MoE)", spec.layers, moe_layers);
        println!("hidden            {}", spec.hidden);
        println!("heads             {} (kv {}, head_dim {})", spec.heads, spec.kv_heads, spec.head_dim);
        println!("vocab             {}", spec.vocab);
        println!(
            "KV cache          {kv_f16} bytes/token with --kv-dtype f16 (default), {kv_f32} with f32, {kv_q8} with q8_0, {kv_q4} with q4_0 ({}{})",
            kv_cache_kind(&spec),
            if windowed.is_empty() { "" } else { "; layers without a sliding window" }
        );
        if let Some(d) = decompressed_kv_f16(&spec) {
            println!(
                "                  {d} bytes/token f16 with --mla-cache decompressed (every head's keys and values)"
            );
        }
        println!(
            "context           {} max ({} MiB of caches per sequence at the max, default dtype)",
            spec.max_positions,
            at_max >> 20
        );
        if let Some(h) = &spec.hybrid {
            println!(
                "linear attention  {linear_layers} of {} layers, {}: {} KiB of f32 conv and recurrent state per sequence at any length (no KV cache; the KV figures above are the full-attention layers')",
                spec.layers,
                linear_kind_name(h.kind),
                spec.linear_state_bytes().div_ceil(1024)
            );
        }
        if spec.mtp_layers > 0 {
            let runs = match &mtp {
                Ok(_) => "runs: `--speculative auto` (the default) or `mtp` drafts from it in generate, chat and serve"
                    .into(),
                Err(why) => format!("not run: {why}"),
            };
            println!("MTP layers        {} (multi-token prediction; {runs})", spec.mtp_layers);
        }
        if !windowed.is_empty() {
            println!(
                "sliding window    keys per layer {}: rings of the window + {} positions ({} MiB at the max with --swa-full, which keeps every position)",
                windowed.join(", "),
                DEFAULT_MAX_BATCH - 1,
                at_max_full >> 20
            );
        }
        if let Some(m) = &spec.moe {
            println!(
                "experts           {} per layer, top-{}, intermediate {}",
                m.num_experts, m.top_k, m.expert_intermediate
            );
            if let Some(s) = m.shared_expert_intermediate {
                println!("shared expert     intermediate {s}");
            }
            println!("bytes per expert  {} (f16)", expert_params * 2);
            println!("expert bytes      {} (f16, all layers)", expert_params * 2 * experts * moe_layers);
            if let Some(b) = mxfp4_per_expert {
                println!(
                    "                  {b} per expert, {} in all, as stored and streamed (MXFP4)",
                    b * experts * moe_layers
                );
            }
        }
        println!("checkpoint bytes  {}", ckpt.stored_bytes());
        if let Some(h) = &heads {
            let recall = recall.map_or(String::new(), |r| format!(", held-out recall@k {r:.3}"));
            println!(
                "prerouter heads   {} ({} heads, {}, width {}{recall})",
                HEADS_FILE,
                h.heads.len(),
                h.config.features,
                h.config.inner
            );
        }
    }
    Ok(())
}
