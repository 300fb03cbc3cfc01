//! Converting a Hugging Face directory once into a cache and reusing it.

use std::path::{Path, PathBuf};

use super::fingerprint::{fnv1a, FNV_OFFSET};
use super::{convert, is_converted, source_fingerprint, ConvertOptions, ModelManifest, Progress};
use crate::error::{Error, Result};

/// Where converted Hugging Face directories are cached: `$MOESTREAM_CACHE`, else
/// `$XDG_CACHE_HOME/moestream`, else `$HOME/.cache/moestream`, else `moestream-cache` in the
/// system temporary directory.
pub fn default_cache_root() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(root) = var("MOESTREAM_CACHE") {
        return root;
    }
    if let Some(xdg) = var("XDG_CACHE_HOME").filter(|p| p.is_absolute()) {
        return xdg.join("moestream");
    }
    match var("HOME") {
        Some(home) => home.join(".cache").join("moestream"),
        None => std::env::temp_dir().join("moestream-cache"),
    }
}

/// The cache directory of `src_canonical` converted with `options`:
/// `<sanitized directory name>-<16 hex digits>`, the hash covering the canonical path and the
/// options. The source fingerprint is deliberately left out of the name: a changed source is
/// converted again into the same directory, replacing the stale copy instead of leaving it
/// behind.
fn cache_dir(src_canonical: &Path, cache_root: &Path, options: Option<&ConvertOptions>) -> PathBuf {
    let parts: Vec<String> = options.iter().flat_map(|o| [o.experts.name(), o.dense.name()]).collect();
    cache_root.join(model_key(src_canonical, &parts))
}

/// A file name standing for the model at `src_canonical` (and `parts`, such as formats): its
/// own name made safe, then a hash of its path and the parts (`name-0123456789abcdef`).
pub fn model_key(src_canonical: &Path, parts: &[String]) -> String {
    let base: String = src_canonical
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' })
                .take(64)
                .collect()
        })
        .filter(|n: &String| !n.is_empty() && !n.starts_with('.'))
        .unwrap_or_else(|| "model".into());
    let mut hash = fnv1a(FNV_OFFSET, src_canonical.as_os_str().as_encoded_bytes());
    for part in parts {
        hash = fnv1a(fnv1a(hash, &[0]), part.as_bytes());
    }
    format!("{base}-{hash:016x}")
}

/// Whether `dir` holds a finished conversion of a source with `fingerprint`, in `options`
/// (`None`: a GGUF source, stored as it is), whose files have their recorded sizes, made by a
/// build that stored MTP layers where the model has them.
fn reusable(dir: &Path, fingerprint: &str, options: Option<&ConvertOptions>) -> bool {
    if !is_converted(dir) {
        return false;
    }
    ModelManifest::load(dir).is_ok_and(|m| {
        m.source.fingerprint == fingerprint
            && (m.arch.mtp_layers == 0 || m.mtp_layer.is_some())
            && options.is_none_or(|o| m.experts.encoding == o.experts && m.dense == o.dense)
            && m.verify_files(dir, false).is_ok()
    })
}

/// The converted form of the Hugging Face directory or GGUF file `src` under `cache_root` (see
/// [`super::default_cache_root`]): reused as is when it exists and the source's
/// [`source_fingerprint`] is unchanged, else (re)converted, reporting `progress`. A GGUF
/// file's experts are stored as they are, so `options` do not apply to it.
pub fn cached_conversion(
    src: &Path,
    cache_root: &Path,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<PathBuf> {
    let src_canonical = src.canonicalize().map_err(|e| Error::io(src, e))?;
    let fingerprint = source_fingerprint(&src_canonical)?;
    let options = (!crate::model::gguf::arch::is_gguf(&src_canonical)).then_some(options);
    let dir = cache_dir(&src_canonical, cache_root, options);
    if reusable(&dir, &fingerprint, options) {
        log::info!("reusing the conversion of {} in {}", src.display(), dir.display());
        return Ok(dir);
    }
    log::info!("converting {} into {}", src.display(), dir.display());
    convert(&src_canonical, &dir, options.unwrap_or(&ConvertOptions::default()), progress)?;
    Ok(dir)
}
