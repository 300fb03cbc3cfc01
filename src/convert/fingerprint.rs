//! Cheap identity of a source directory, and whole-file checksums of outputs.

use std::io::Read;
use std::path::Path;
use std::time::UNIX_EPOCH;

use crate::error::{Error, Result};

/// FNV-1a (64-bit) of `bytes`, continuing from `hash` (start with [`FNV_OFFSET`]).
pub(super) fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

/// The FNV-1a offset basis.
pub(super) const FNV_OFFSET: u64 = 0xcbf29ce484222325;

/// A hash over the (file name, size, modification time) of `config.json`,
/// `model.safetensors.index.json` (when present) and every `*.safetensors` file of a Hugging
/// Face directory, or of every part of a GGUF model, as 16 hex digits. It changes when any of
/// them is replaced, touched or resized, without reading their contents. Fails with
/// [`Error::Io`] when the directory, its `config.json` or a GGUF part cannot be read.
pub fn source_fingerprint(source: &Path) -> Result<String> {
    if crate::model::gguf::arch::is_gguf(source) {
        return fingerprint_files(&crate::model::gguf::part_paths(source));
    }
    let hf_dir = source;
    let mut names: Vec<String> = std::fs::read_dir(hf_dir)
        .map_err(|e| Error::io(hf_dir, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n == "model.safetensors.index.json" || n.ends_with(".safetensors"))
        .collect();
    names.push("config.json".into());
    names.sort();
    fingerprint_files(&names.iter().map(|n| hf_dir.join(n)).collect::<Vec<_>>())
}

/// The hash of [`source_fingerprint`] over `paths`, in order.
fn fingerprint_files(paths: &[std::path::PathBuf]) -> Result<String> {
    let mut hash = FNV_OFFSET;
    for path in paths {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        let mtime = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
        hash = fnv1a(hash, name.as_bytes());
        hash = fnv1a(hash, &[0]);
        hash = fnv1a(hash, &meta.len().to_le_bytes());
        hash = fnv1a(hash, &mtime.to_le_bytes());
    }
    Ok(format!("{hash:016x}"))
}

/// The length and crc32 of a whole file, read in 1 MiB pieces (no mapping, so the process's
/// resident set does not grow with the file).
pub(super) fn file_crc32(path: &Path) -> Result<(u64, u32)> {
    let io = |e| Error::io(path, e);
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        };
        hasher.update(&buf[..n]);
        len += n as u64;
    }
    Ok((len, hasher.finalize()))
}
