//! The process's resident set size, now and at its peak, read the way each platform keeps
//! them: Linux's `VmRSS` and `VmHWM` in `/proc/self/status`, macOS's `resident_size` and
//! `resident_size_max` from `task_info`, Windows' `WorkingSetSize` and `PeakWorkingSetSize` from
//! `GetProcessMemoryInfo`. (`getrusage`'s `ru_maxrss` is no substitute: Linux carries it across
//! `fork` + `exec`, so a child reports its parent's peak.)

/// The process's peak resident set size in bytes; 0 where the platform does not say.
pub fn peak_rss_bytes() -> u64 {
    platform_rss().map_or(0, |r| r.peak)
}

/// The process's resident set size now, in bytes; 0 where the platform does not say.
pub fn current_rss_bytes() -> u64 {
    platform_rss().map_or(0, |r| r.current)
}

/// Resident bytes now and at the peak.
struct Rss {
    current: u64,
    peak: u64,
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn platform_rss() -> Option<Rss> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    Some(Rss { current: kib("VmRSS:")?, peak: kib("VmHWM:")? })
}

#[cfg(target_vendor = "apple")]
fn platform_rss() -> Option<Rss> {
    use mach2::task_info::{mach_task_basic_info, MACH_TASK_BASIC_INFO, MACH_TASK_BASIC_INFO_COUNT};
    let mut info = mach_task_basic_info::default();
    let mut count = MACH_TASK_BASIC_INFO_COUNT;
    // SAFETY: `info` is a `mach_task_basic_info` and `count` its size in natural-width words, as
    // task_info(MACH_TASK_BASIC_INFO) expects; the kernel writes at most `count` words.
    let status = unsafe {
        let out = (&mut info as *mut mach_task_basic_info).cast();
        mach2::task::task_info(mach2::traps::mach_task_self(), MACH_TASK_BASIC_INFO, out, &mut count)
    };
    (status == mach2::kern_return::KERN_SUCCESS)
        .then_some(Rss { current: info.resident_size, peak: info.resident_size_max })
}

#[cfg(windows)]
fn platform_rss() -> Option<Rss> {
    use windows::Win32::System::ProcessStatus::{GetProcessMemoryInfo, PROCESS_MEMORY_COUNTERS};
    use windows::Win32::System::Threading::GetCurrentProcess;
    let size = std::mem::size_of::<PROCESS_MEMORY_COUNTERS>() as u32;
    let mut counters = PROCESS_MEMORY_COUNTERS::default();
    // SAFETY: GetCurrentProcess returns a pseudo-handle that needs no closing; `counters` is a
    // PROCESS_MEMORY_COUNTERS of `size` bytes, which GetProcessMemoryInfo fills.
    unsafe { GetProcessMemoryInfo(GetCurrentProcess(), &mut counters, size) }.ok()?;
    Some(Rss { current: counters.WorkingSetSize as u64, peak: counters.PeakWorkingSetSize as u64 })
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_vendor = "apple", windows)))]
fn platform_rss() -> Option<Rss> {
    None
}

#[cfg(test)]
mod tests {
    /// Touching 64 MiB raises the peak past it on the platforms that keep one.
    #[test]
    #[cfg(any(target_os = "linux", target_os = "android", target_vendor = "apple", windows))]
    fn peak_rss_covers_memory_the_process_touched() {
        let touched = vec![1u8; 64 << 20];
        let peak = super::peak_rss_bytes();
        assert!(peak >= touched.len() as u64, "peak RSS {peak} below the {} bytes touched", touched.len());
        let current = super::current_rss_bytes();
        assert!(current >= touched.len() as u64, "RSS {current} below the {} bytes touched", touched.len());
        assert_eq!(touched.iter().map(|&b| b as u64).sum::<u64>(), touched.len() as u64);
    }
}
