//! A checkpoint's multi-token-prediction ("MTP", "nextn") module: the layer DeepSeek-V3,
//! GLM-4.5 and Ling 2.5 ship after their decoder layers, `model.layers.{num_hidden_layers}.*`
//! (Qwen3-Next's `mtp.*`, read under those names: [`names::from_mtp`]), which predicts
//! the token after next from the main model's hidden state `h[i]` (its final norm's output, as
//! vLLM and SGLang hand it over) and the next token `t[i+1]`:
//!
//! ```text
//! x = eh_proj([enorm(embed(t[i+1])) | hnorm(h[i])])      // [hidden, 2 * hidden]
//! x = decoder layer (attention with its own KV cache, routed experts) at position i
//! logits = head(shared_head.norm(x))                      // the model's lm_head
//! ```
//!
//! (the DeepSeek-V3 technical report's module, as the checkpoints' serving code runs it). Its
//! decoder layer is read like any layer of [`with_mtp_layer`]'s spec, its routed experts
//! included. The released checkpoints' `shared_head.head` is a copy of `lm_head` (the report's
//! shared output head), which the module uses; one whose sampled rows differ is refused. Ling
//! (`BailingHybrid`, Ling's own names: vLLM's `bailing_moe_mtp.py`) names the head norm
//! `final_layernorm` and ships no copy of the head; its decoder layer is an MLA layer with its
//! output gate, as the model's full-attention layers.

use super::config::{ArchSpec, Family};
use super::layer_weights::{self, LayerWeights};
use super::names;
use super::weights::{Checkpoint, HostTensor};
use crate::error::{Error, Result};

/// The weights of an MTP module besides its routed experts.
#[derive(Clone, Debug)]
pub struct MtpWeights {
    /// `enorm` `[hidden]`: the next token's embedding is normalised by it.
    pub embed_norm: HostTensor,
    /// `hnorm` `[hidden]`: the main model's hidden state is normalised by it.
    pub hidden_norm: HostTensor,
    /// `eh_proj`'s columns that read the normalised embedding, `[hidden, hidden]`.
    pub embed_proj: HostTensor,
    /// `eh_proj`'s columns that read the normalised hidden state, `[hidden, hidden]`.
    pub hidden_proj: HostTensor,
    /// The module's decoder layer, layer `spec.layers` of [`with_mtp_layer`]'s spec.
    pub layer: LayerWeights,
    /// `shared_head.norm` `[hidden]`, before the model's lm_head.
    pub head_norm: HostTensor,
}

/// `spec` with its first MTP layer appended as one more decoder layer (the layer's index is
/// `spec.layers`): an MoE layer with full attention, as DeepSeek-V3, GLM-4.5, Ling and the Qwen
/// families ship it (a hybrid model's appended layer is a full-attention one). Other
/// families' MTP layouts, and models without MTP layers, are refused by name.
pub fn with_mtp_layer(spec: &ArchSpec) -> Result<ArchSpec> {
    if spec.mtp_layers == 0 {
        return Err(Error::UnsupportedConfig(
            "--speculative mtp: this model ships no MTP layers (num_nextn_predict_layers is 0 or absent)".into(),
        ));
    }
    let runs = [
        Family::DeepseekV3,
        Family::Glm4Moe,
        Family::Qwen3Moe,
        Family::Qwen3Next,
        Family::Qwen35Moe,
        Family::BailingHybrid,
    ];
    if !runs.contains(&spec.family) {
        return Err(Error::UnsupportedConfig(format!(
            "--speculative mtp: {}'s MTP layers are not run yet (DeepSeek-V3, GLM-4.5, Ling 2.5, Qwen3-Next, \
             Qwen3.5-MoE and Qwen3-MoE ones are); use --speculative ngram",
            spec.family.hf_name()
        )));
    }
    let mut ext = spec.clone();
    ext.layers += 1;
    ext.moe_layers.push(spec.moe.is_some());
    if !ext.layer_windows.is_empty() {
        ext.layer_windows.push(None);
    }
    Ok(ext)
}

/// `spec` with its MTP layer appended ([`with_mtp_layer`]) where `ck` holds an MTP module this
/// crate runs, else why not.
pub fn available(ck: &Checkpoint, spec: &ArchSpec) -> Result<ArchSpec> {
    let ext = with_mtp_layer(spec)?;
    let eh_proj = format!("{}.eh_proj.weight", names::layer(spec.layers));
    if !ck.contains(&eh_proj) {
        return Err(Error::UnsupportedConfig(format!(
            "--speculative mtp: the checkpoint has no `{eh_proj}` (a GGUF file converted without its `nextn` \
             tensors, or a checkpoint without the MTP weights)"
        )));
    }
    // From GGUF (`blk.N.nextn.*`, llama.cpp's converter), the families whose MTP layer is checked
    // against a torch reference (llama.cpp writes none for DeepSeek-V3).
    if ck.ggml_type(&eh_proj).is_some()
        && !matches!(spec.family, Family::Glm4Moe | Family::Qwen35Moe | Family::Qwen3Next)
    {
        return Err(Error::UnsupportedConfig(format!(
            "--speculative mtp: {}'s MTP layer from a GGUF file is not read yet (GLM-4.5's, Qwen3-Next's and \
             Qwen3.5-MoE's are); use the Hugging Face checkpoint",
            spec.family.hf_name()
        )));
    }
    check_shared_head(ck, spec, &copies(spec)[1])?;
    Ok(ext)
}

/// The MTP layer's copies of the model's tensors, which the module does not read: its
/// `embed_tokens` and `shared_head.head` (checked against the lm_head by [`available`]).
pub fn copies(spec: &ArchSpec) -> [String; 2] {
    let p = names::layer(spec.layers);
    [format!("{p}.embed_tokens.weight"), format!("{p}.shared_head.head.weight")]
}

/// Reads the MTP module of `ck`, a checkpoint of `spec` (the model's own spec, without the MTP
/// layer), where it has one that runs ([`available`]): `spec` with the MTP layer appended, and
/// the module's weights.
pub fn read(ck: &Checkpoint, spec: &ArchSpec) -> Result<(ArchSpec, MtpWeights)> {
    let ext = available(ck, spec)?;
    let (h, l) = (spec.hidden, spec.layers);
    let p = names::layer(l);
    let name = |t: &str| format!("{p}.{t}");
    let eh = ck.tensor(&name("eh_proj.weight"), &[h, 2 * h])?;
    let columns = |from: usize| {
        let data = eh.data.chunks_exact(2 * h).flat_map(|row| row[from..from + h].iter().copied()).collect();
        HostTensor::new(vec![h, h], data)
    };
    // Qwen3-Next's norms are stored zero-centred, as its layers' are.
    let norm = |t: &str| ck.tensor(&name(t), &[h]).map(|w| layer_weights::centred(spec, w));
    let weights = MtpWeights {
        embed_norm: norm("enorm.weight")?,
        hidden_norm: norm("hnorm.weight")?,
        embed_proj: columns(0),
        hidden_proj: columns(h),
        layer: layer_weights::layer(ck, &ext, l)?,
        head_norm: norm(head_norm_name(spec.family))?,
    };
    Ok((ext, weights))
}

/// The MTP layer's norm before the lm_head: Ling's `final_layernorm`, the others'
/// `shared_head.norm` (Qwen3-Next's `mtp.norm`, renamed to it).
fn head_norm_name(family: Family) -> &'static str {
    match family {
        Family::BailingHybrid => "final_layernorm.weight",
        _ => "shared_head.norm.weight",
    }
}

/// Checks that the MTP's `shared_head.head` (where the checkpoint has one: a converted model
/// leaves it out) holds the model's lm_head, on its first, middle and last rows.
fn check_shared_head(ck: &Checkpoint, spec: &ArchSpec, head: &str) -> Result<()> {
    if !ck.contains(head) {
        return Ok(());
    }
    let main = match spec.tie_embeddings && !ck.contains(names::LM_HEAD) {
        true => names::EMBED,
        false => names::LM_HEAD,
    };
    let shape = [spec.vocab, spec.hidden];
    // A GGUF file may quantize the copy to another type than the lm_head (llama-quantize picks
    // the lm_head's by its name): then equal within what quantizing changes.
    let same_type = ck.ggml_type(head) == ck.ggml_type(main);
    for row in [0, spec.vocab / 2, spec.vocab - 1] {
        let (copy, own) = (ck.slab(head, &shape, row)?.data, ck.slab(main, &shape, row)?.data);
        // Otherwise within a tenth of the row's RMS.
        let off: f32 = copy.iter().zip(&own).map(|(a, b)| (a - b) * (a - b)).sum();
        let equal = match same_type {
            true => copy == own,
            false => off <= 0.01 * own.iter().map(|x| x * x).sum::<f32>(),
        };
        if !equal {
            return Err(Error::UnsupportedConfig(format!(
                "--speculative mtp: `{head}` differs from `{main}` (row {row}); an MTP head of its own is not implemented"
            )));
        }
    }
    Ok(())
}
