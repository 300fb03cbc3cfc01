//! The output directory: checking it is safe to write, and copying config, tokenizer and chat
//! template files.

use std::path::Path;

use super::{EXPERTS_FILE, MANIFEST_FILE, RESIDENT_FILE};
use crate::error::{Error, Result};
use crate::util::model_files::HEADS_FILE;

/// Small files copied verbatim from the source, when present (`config.json` is required).
const COPIED_FILES: [&str; 7] = [
    "config.json",
    crate::util::model_files::TEMPLATE_FILE,
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    HEADS_FILE,
];

/// Whether `name` is something a conversion writes (including its temporaries), so that a
/// previous or interrupted conversion may be overwritten.
fn is_conversion_output(name: &str) -> bool {
    COPIED_FILES.contains(&name)
        || [EXPERTS_FILE, RESIDENT_FILE, MANIFEST_FILE].contains(&name)
        || name.ends_with(".partial")
        || name.ends_with(".tmp")
        || name.starts_with(".tmp")
}

/// Creates `out` (and its parents) or checks that an existing one holds only conversion
/// outputs, refusing the source directory itself; then removes those outputs, `model.json`
/// first, so the directory does not look converted until this conversion finishes and holds
/// nothing stale from an earlier one.
pub(super) fn prepare_output(src_canonical: &Path, out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let out_canonical = out.canonicalize().map_err(|e| Error::io(out, e))?;
    if out_canonical == src_canonical {
        return Err(Error::InvalidArgument(format!(
            "output directory {} is the source directory; choose another",
            out.display()
        )));
    }
    let mut old = Vec::new();
    for entry in std::fs::read_dir(out).map_err(|e| Error::io(out, e))? {
        let entry = entry.map_err(|e| Error::io(out, e))?;
        let name = entry.file_name();
        match name.to_str().filter(|n| is_conversion_output(n) && entry.file_type().is_ok_and(|t| t.is_file())) {
            Some(n) => old.push(n.to_string()),
            None => {
                return Err(Error::InvalidArgument(format!(
                "output directory {} holds {name:?}, which a conversion does not write; use an empty or new directory",
                out.display()
            )))
            }
        }
    }
    old.sort_by_key(|n| n != MANIFEST_FILE);
    for name in old {
        let path = out.join(name);
        std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

/// Copies [`COPIED_FILES`] that exist in `src` into `out` and returns their names.
pub(super) fn copy_extra_files(src: &Path, out: &Path) -> Result<Vec<String>> {
    let mut copied = Vec::new();
    for name in COPIED_FILES {
        let from = src.join(name);
        if from.is_file() {
            std::fs::copy(&from, out.join(name)).map_err(|e| Error::io(&from, e))?;
            copied.push(name.to_string());
        }
    }
    Ok(copied)
}
