//! Gives the heap memory a dropped engine freed back to the operating system.
//!
//! glibc's allocator keeps freed memory in the process: after the first free of a large mapped
//! block it raises its mmap threshold to that block's size (up to 32 MiB), so later weights,
//! staging buffers and lavapipe's "device" memory (which lavapipe takes from `malloc`) come from
//! its heaps instead of mappings of their own, and a heap gives memory back only from its top,
//! past a trim threshold raised with it (up to 64 MiB); `malloc_trim` returns the free pages
//! inside every heap, but not a thread heap's top. Measured in `tests/engine_memory.rs`: without
//! either, `serve` restarted in one process grew by ~35 MiB per restart (most of a model's
//! size); with the trim alone a thread heap still kept ~30 MiB of a dropped model at its top.
//! So an engine pins both thresholds when it loads ([`keep_large_blocks_mapped`]: blocks of
//! 1 MiB and more mapped on their own, so freeing one unmaps it; heap tops trimmed past 1 MiB)
//! and trims every heap when dropped ([`TrimOnDrop`]). Elsewhere (other allocators) both do
//! nothing.

/// Trims the heap when dropped: placed last in an owner, it runs after the owner's other fields
/// (its buffers, threads and GPU context) have been freed.
#[derive(Debug, Default)]
pub struct TrimOnDrop;

impl Drop for TrimOnDrop {
    fn drop(&mut self) {
        trim();
    }
}

/// Returns the free pages of every heap of the process to the operating system.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists, under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Largest block the allocator takes from its heaps, and the free top a heap keeps: 1 MiB.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const THRESHOLD: i32 = 1 << 20;

/// Pins glibc's mmap and trim thresholds at 1 MiB (once per process): blocks of 1 MiB and more
/// get mappings of their own, which their free unmaps, and a heap's free top past 1 MiB is given
/// back as it is freed.
pub fn keep_large_blocks_mapped() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static PINNED: std::sync::Once = std::sync::Once::new();
        // SAFETY: mallopt only sets the allocator's parameters, under its lock.
        PINNED.call_once(|| unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, THRESHOLD);
        });
    }
}
