//! The KV budget: GPU memory set aside for the caches of every live sequence.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::{Error, Result};

/// GPU memory set aside for the caches of every live sequence: caches reserve their bytes when
/// created and give them back when dropped.
#[derive(Debug)]
pub(crate) struct KvLedger {
    limit: u64,
    used: AtomicU64,
}

impl KvLedger {
    pub(super) fn new(limit: u64) -> Arc<KvLedger> {
        Arc::new(KvLedger { limit, used: AtomicU64::new(0) })
    }

    /// Reserves `bytes`, or says why not (before anything is allocated).
    pub(super) fn reserve(&self, bytes: u64) -> Result<()> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let available = self.limit.saturating_sub(used);
            if bytes > available {
                return Err(Error::KvCacheTooLarge { what: "one more sequence".into(), needed: bytes, available });
            }
            match self.used.compare_exchange(used, used + bytes, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => used = now,
            }
        }
    }

    pub(super) fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}
