//! Whether the expert store is read with O_DIRECT (`--direct-io auto|on|off`).
//!
//! `auto` turns uncached reads on when the store is larger than the memory this process may
//! use: the host's available memory, or its memory cgroup's limit when lower (a cgroup limit
//! counts the page cache). Such a store cannot stay cached anyway; buffered reads would only
//! copy every expert twice and evict the rest of the process's memory to cache bytes that are
//! gone again before they are read twice.

use std::path::{Path, PathBuf};

/// How the expert store is opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirectIo {
    /// On when the store exceeds the memory available (see the module doc).
    #[default]
    Auto,
    /// Always try uncached reads (falling back to buffered ones where refused, with a log line).
    On,
    /// Always buffered reads through the page cache.
    Off,
}

/// The memory this process may fill, and where that figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryBound {
    /// Bytes.
    pub bytes: u64,
    /// `"available host memory"` or the cgroup file the limit was read from.
    pub source: String,
}

impl DirectIo {
    /// Whether a store of `store_bytes` is read uncached, with the reason (for the log).
    pub fn resolve(self, store_bytes: u64) -> (bool, String) {
        match self {
            DirectIo::On => (true, "--direct-io on".into()),
            DirectIo::Off => (false, "--direct-io off".into()),
            DirectIo::Auto => {
                let bound = memory_bound();
                let direct = store_bytes > bound.bytes;
                let cmp = if direct { "exceeds" } else { "fits in" };
                (
                    direct,
                    format!("the expert store ({store_bytes} bytes) {cmp} {} bytes ({})", bound.bytes, bound.source),
                )
            }
        }
    }
}

/// The smaller of the host's available memory and this process's cgroup memory limit.
pub fn memory_bound() -> MemoryBound {
    let host = crate::gpu::memory::host_memory().available;
    match cgroup_memory_limit() {
        Some((limit, file)) if limit < host => MemoryBound { bytes: limit, source: file.display().to_string() },
        _ => MemoryBound { bytes: host, source: "available host memory".into() },
    }
}

/// The lowest memory limit of this process's cgroup and its ancestors (cgroup v1
/// `memory.limit_in_bytes` or v2 `memory.max`), with the file it was read from; `None` when
/// unlimited or not on Linux.
pub fn cgroup_memory_limit() -> Option<(u64, PathBuf)> {
    let table = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let root = Path::new("/sys/fs/cgroup");
    let mut best: Option<(u64, PathBuf)> = None;
    for line in table.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let (base, file) = if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else {
            continue;
        };
        let mut dir = Some(Path::new(path.trim_start_matches('/')));
        while let Some(d) = dir {
            let candidate = base.join(d).join(file);
            let limit = std::fs::read_to_string(&candidate).ok().and_then(|t| t.trim().parse::<u64>().ok());
            if let Some(limit) = limit.filter(|&l| best.as_ref().is_none_or(|(b, _)| l < *b)) {
                best = Some((limit, candidate));
            }
            dir = d.parent();
        }
    }
    best
}
