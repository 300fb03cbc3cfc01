//! Whether the expert store is read with O_DIRECT (`--direct-io auto|on|off`).
//!
//! `auto` turns uncached reads on when the store is larger than the memory this process may
//! use: the host's available memory, or its memory cgroup's limit when lower (a cgroup limit
//! counts the page cache). Such a store cannot stay cached anyway; buffered reads would only
//! copy every expert twice and evict the rest of the process's memory to cache bytes that are
//! gone again before they are read twice.

use crate::gpu::memory::cgroup_memory_limit;

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
        Some((limit, file)) if limit <= host => MemoryBound { bytes: limit, source: file.display().to_string() },
        _ => MemoryBound { bytes: host, source: "available host memory".into() },
    }
}
