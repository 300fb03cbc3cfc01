//! The prefetcher's I/O threads: a pool reading expert extents from an [`ExpertSource`] into
//! reusable 4 KiB-aligned staging buffers (so an O_DIRECT store reads straight into them), by
//! priority (on-demand reads before prefetches, nearer layers first), with cancellation of
//! reads that became useless. Every read is counted: bytes, time, the readers' CPU time, and
//! the wall time during which at least one read was in flight ([`IoCounters`]).

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::policy::ExpertId;
use super::source::ExpertSource;
use crate::error::{Error, Result};
use crate::store::AlignedBuf;

/// Identifies one submitted read.
pub type Ticket = u64;

/// How urgent a read is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Urgency {
    /// A guess about a later layer.
    Prefetch,
    /// The GPU is waiting for it.
    Demand,
}

#[derive(PartialEq, Eq)]
struct Request {
    urgency: Urgency,
    layer: u32,
    ticket: Ticket,
    id: ExpertId,
}

impl Ord for Request {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Max-heap: demand first, then the nearest layer, then the oldest request.
        self.urgency.cmp(&other.urgency).then(other.layer.cmp(&self.layer)).then(other.ticket.cmp(&self.ticket))
    }
}

impl PartialOrd for Request {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// What the readers did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IoCounters {
    /// Reads finished (including cancelled ones whose data was thrown away).
    pub reads: u64,
    /// Bytes those reads asked the source for.
    pub bytes: u64,
    /// Wall time during which at least one read was in flight.
    pub busy: Duration,
    /// Sum of every read's own duration (exceeds `busy` when reads overlap).
    pub read_time: Duration,
    /// CPU time the reader threads spent inside reads (system calls, copies out of the page
    /// cache, checksums); zero where the platform has no per-thread CPU clock.
    pub cpu_time: Duration,
}

#[derive(Default)]
struct State {
    queue: BinaryHeap<Request>,
    done: HashMap<Ticket, Result<AlignedBuf>>,
    cancelled: HashSet<Ticket>,
    spare: Vec<AlignedBuf>,
    next: Ticket,
    shutdown: bool,
    in_flight: usize,
    busy_since: Option<Instant>,
    counters: IoCounters,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    finished: Condvar,
    source: Arc<dyn ExpertSource>,
    /// Staging buffers kept for reuse (one per reader): a burst of prefetches allocates more,
    /// which are freed as they come back instead of staying with the pool.
    spare_limit: usize,
}

impl State {
    /// Keeps `buf` for the next read, or frees it when enough are kept.
    fn keep(&mut self, buf: AlignedBuf, limit: usize) {
        if self.spare.len() < limit {
            self.spare.push(buf);
        }
    }
}

/// A pool of reader threads.
pub struct IoPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl IoPool {
    /// Starts `threads` readers (at least one) over `source`.
    pub fn new(source: Arc<dyn ExpertSource>, threads: usize) -> IoPool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            finished: Condvar::new(),
            source,
            spare_limit: threads,
        });
        let threads = (0..threads)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("moestream-io-{i}"))
                    .spawn(move || reader(&shared))
                    .expect("spawning an I/O thread")
            })
            .collect();
        IoPool { shared, threads }
    }

    /// Queues a read of `id`.
    pub fn submit(&self, id: ExpertId, urgency: Urgency) -> Ticket {
        let mut s = self.shared.state.lock().unwrap();
        s.next += 1;
        let ticket = s.next;
        s.queue.push(Request { urgency, layer: id.layer, ticket, id });
        drop(s);
        self.shared.work.notify_one();
        ticket
    }

    /// The data of `ticket`, waiting for it (a queued prefetch is promoted to demand).
    pub fn wait(&self, ticket: Ticket) -> Result<AlignedBuf> {
        let mut s = self.shared.state.lock().unwrap();
        let mut promoted = None;
        s.queue.retain(|r| {
            if r.ticket == ticket {
                promoted = Some(Request { urgency: Urgency::Demand, layer: r.layer, ticket, id: r.id });
                false
            } else {
                true
            }
        });
        if let Some(r) = promoted {
            s.queue.push(r);
            self.shared.work.notify_one();
        }
        loop {
            if let Some(r) = s.done.remove(&ticket) {
                return r;
            }
            if s.shutdown {
                return Err(Error::Gpu("I/O pool shut down".into()));
            }
            s = self.shared.finished.wait(s).unwrap();
        }
    }

    /// The data of `ticket` if its read has finished.
    pub fn try_take(&self, ticket: Ticket) -> Option<Result<AlignedBuf>> {
        self.shared.state.lock().unwrap().done.remove(&ticket)
    }

    /// Drops `ticket`: removed from the queue, or its result discarded when it arrives.
    pub fn cancel(&self, ticket: Ticket) {
        let mut s = self.shared.state.lock().unwrap();
        let before = s.queue.len();
        s.queue.retain(|r| r.ticket != ticket);
        if s.queue.len() == before {
            if let Some(Ok(buf)) = s.done.remove(&ticket) {
                s.keep(buf, self.shared.spare_limit);
            } else {
                s.cancelled.insert(ticket);
            }
        }
    }

    /// Returns a staging buffer for reuse (or frees it, when the pool keeps enough).
    pub fn recycle(&self, buf: AlignedBuf) {
        self.shared.state.lock().unwrap().keep(buf, self.shared.spare_limit);
    }

    /// The readers' figures so far (`busy` includes the read now in flight, if any).
    pub fn counters(&self) -> IoCounters {
        let s = self.shared.state.lock().unwrap();
        let mut c = s.counters;
        if let Some(since) = s.busy_since {
            c.busy += since.elapsed();
        }
        c
    }
}

fn reader(shared: &Shared) {
    loop {
        let (req, mut buf) = {
            let mut s = shared.state.lock().unwrap();
            loop {
                if s.shutdown {
                    return;
                }
                if let Some(r) = s.queue.pop() {
                    let buf = s.spare.pop().unwrap_or_else(|| AlignedBuf::new(shared.source.read_len()));
                    if s.in_flight == 0 {
                        s.busy_since = Some(Instant::now());
                    }
                    s.in_flight += 1;
                    break (r, buf);
                }
                s = shared.work.wait(s).unwrap();
            }
        };
        let (started, cpu_before) = (Instant::now(), thread_cpu_time());
        let result = shared.source.read(req.id.layer as usize, req.id.expert as usize, &mut buf).map(|_| buf);
        let (took, cpu) = (started.elapsed(), thread_cpu_time().saturating_sub(cpu_before));
        let mut s = shared.state.lock().unwrap();
        s.in_flight -= 1;
        if s.in_flight == 0 {
            if let Some(since) = s.busy_since.take() {
                s.counters.busy += since.elapsed();
            }
        }
        s.counters.reads += 1;
        s.counters.bytes += shared.source.disk_bytes();
        s.counters.read_time += took;
        s.counters.cpu_time += cpu;
        if s.cancelled.remove(&req.ticket) {
            if let Ok(buf) = result {
                s.keep(buf, shared.spare_limit);
            }
        } else {
            s.done.insert(req.ticket, result);
        }
        drop(s);
        shared.finished.notify_all();
    }
}

/// CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`); zero where unavailable.
fn thread_cpu_time() -> Duration {
    #[cfg(unix)]
    {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes one timespec through a valid pointer.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0 {
            return Duration::new(t.tv_sec as u64, t.tv_nsec as u32);
        }
    }
    Duration::ZERO
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.shared.state.lock().unwrap().shutdown = true;
        self.shared.work.notify_all();
        self.shared.finished.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experts::arena::SlotLayout;
    use crate::ops::WeightFormat;

    /// Zeros of one small f32 slot.
    struct Zeros(SlotLayout);

    impl ExpertSource for Zeros {
        fn read(&self, _: usize, _: usize, buf: &mut [u8]) -> Result<()> {
            buf.fill(0);
            Ok(())
        }
        fn read_len(&self) -> usize {
            self.0.slot_bytes
        }
        fn disk_bytes(&self) -> u64 {
            self.0.slot_bytes as u64
        }
        fn layout(&self) -> SlotLayout {
            self.0
        }
        fn layer_layout(&self, _: usize) -> SlotLayout {
            self.0
        }
    }

    /// A burst of reads allocates a buffer each; once they come back the pool keeps one per
    /// reader and frees the rest.
    #[test]
    fn a_burst_leaves_one_spare_buffer_per_reader() {
        let layout = SlotLayout::new(WeightFormat::F32, 8, 8).unwrap();
        let pool = IoPool::new(Arc::new(Zeros(layout)), 2);
        let tickets: Vec<Ticket> =
            (0..12).map(|e| pool.submit(ExpertId { layer: 0, expert: e }, Urgency::Prefetch)).collect();
        let bufs: Vec<AlignedBuf> = tickets.iter().map(|&t| pool.wait(t).unwrap()).collect();
        for buf in bufs {
            pool.recycle(buf);
        }
        assert_eq!(pool.shared.state.lock().unwrap().spare.len(), 2);
    }
}
