//! The prefetcher's I/O threads: a pool reading expert extents from an [`ExpertSource`] into
//! reusable staging buffers, by priority (on-demand reads before prefetches, nearer layers
//! first), with cancellation of reads that became useless.

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::policy::ExpertId;
use super::source::ExpertSource;
use crate::error::{Error, Result};

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

#[derive(Default)]
struct State {
    queue: BinaryHeap<Request>,
    done: HashMap<Ticket, Result<Vec<u8>>>,
    cancelled: HashSet<Ticket>,
    spare: Vec<Vec<u8>>,
    next: Ticket,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    finished: Condvar,
    source: Arc<dyn ExpertSource>,
}

/// A pool of reader threads.
pub struct IoPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl IoPool {
    /// Starts `threads` readers (at least one) over `source`.
    pub fn new(source: Arc<dyn ExpertSource>, threads: usize) -> IoPool {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            finished: Condvar::new(),
            source,
        });
        let threads = (0..threads.max(1))
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
    pub fn wait(&self, ticket: Ticket) -> Result<Vec<u8>> {
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
    pub fn try_take(&self, ticket: Ticket) -> Option<Result<Vec<u8>>> {
        self.shared.state.lock().unwrap().done.remove(&ticket)
    }

    /// Drops `ticket`: removed from the queue, or its result discarded when it arrives.
    pub fn cancel(&self, ticket: Ticket) {
        let mut s = self.shared.state.lock().unwrap();
        let before = s.queue.len();
        s.queue.retain(|r| r.ticket != ticket);
        if s.queue.len() == before {
            if let Some(Ok(buf)) = s.done.remove(&ticket) {
                s.spare.push(buf);
            } else {
                s.cancelled.insert(ticket);
            }
        }
    }

    /// Returns a staging buffer for reuse.
    pub fn recycle(&self, buf: Vec<u8>) {
        self.shared.state.lock().unwrap().spare.push(buf);
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
                    let buf = s.spare.pop().unwrap_or_else(|| vec![0u8; shared.source.read_len()]);
                    break (r, buf);
                }
                s = shared.work.wait(s).unwrap();
            }
        };
        let result = shared.source.read(req.id.layer as usize, req.id.expert as usize, &mut buf).map(|_| buf);
        let mut s = shared.state.lock().unwrap();
        if s.cancelled.remove(&req.ticket) {
            if let Ok(buf) = result {
                s.spare.push(buf);
            }
        } else {
            s.done.insert(req.ticket, result);
        }
        drop(s);
        shared.finished.notify_all();
    }
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
