//! `fio`-style read bandwidth of the device holding a file, measured on the file itself:
//! sequential 1 MiB reads and 4 KiB random reads from several threads, uncached (O_DIRECT or
//! F_NOCACHE) so the page cache does not answer for the device.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::store::{open_uncached, AlignedBuf, PositionedIo};
use crate::util::rng::SplitMix64;

/// Bytes of one sequential read.
const SEQUENTIAL_BLOCK: usize = 1 << 20;
/// Bytes of one random read.
const RANDOM_BLOCK: usize = 4096;

/// What the device delivered.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceBandwidth {
    /// Sequential 1 MiB reads, one thread, MB/s (10^6 bytes).
    pub sequential_mb_s: f64,
    /// 4 KiB random reads from `random_threads` threads, MB/s.
    pub random_4k_mb_s: f64,
    /// The same as reads per second.
    pub random_4k_iops: f64,
    /// Threads issuing random reads (each one read in flight).
    pub random_threads: usize,
}

/// Measures `path`'s device for about `seconds` per pattern. Fails when uncached reads are
/// refused (a cached figure would measure memory, not the device).
pub fn measure(path: &Path, seconds: f64, random_threads: usize) -> Result<DeviceBandwidth> {
    let file = open_uncached(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let blocks = len / SEQUENTIAL_BLOCK as u64;
    if blocks == 0 {
        return Err(Error::InvalidArgument(format!("{}: too small to measure ({len} bytes)", path.display())));
    }
    let budget = Duration::from_secs_f64(seconds.max(0.05));
    let mut buf = AlignedBuf::new(SEQUENTIAL_BLOCK);
    let (start, mut read) = (Instant::now(), 0u64);
    while start.elapsed() < budget && read / (SEQUENTIAL_BLOCK as u64) < blocks {
        file.read_exact_at(&mut buf, read).map_err(|e| Error::io(path, e))?;
        read += SEQUENTIAL_BLOCK as u64;
    }
    let sequential_mb_s = read as f64 / start.elapsed().as_secs_f64() / 1e6;
    let pages = len / RANDOM_BLOCK as u64;
    let threads = random_threads.max(1);
    let start = Instant::now();
    let reads: Vec<Result<u64>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let file = &file;
                scope.spawn(move || {
                    let (mut rng, mut buf, mut n) =
                        (SplitMix64::new(t as u64 + 1), AlignedBuf::new(RANDOM_BLOCK), 0u64);
                    while start.elapsed() < budget {
                        let offset = rng.next_u64() % pages * RANDOM_BLOCK as u64;
                        file.read_exact_at(&mut buf, offset).map_err(|e| Error::io(path, e))?;
                        n += 1;
                    }
                    Ok(n)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap_or_else(|_| Err(Error::Gpu("reader panicked".into())))).collect()
    });
    let n: u64 = reads.into_iter().sum::<Result<u64>>()?;
    let secs = start.elapsed().as_secs_f64();
    Ok(DeviceBandwidth {
        sequential_mb_s,
        random_4k_mb_s: (n * RANDOM_BLOCK as u64) as f64 / secs / 1e6,
        random_4k_iops: n as f64 / secs,
        random_threads: threads,
    })
}
