//! Independent per-head jobs spread over a few threads, results in job order.

/// `f(0..jobs)` on up to `threads` threads (job `i` on thread `i % threads`); the results in job
/// order.
pub fn map_in_threads<T: Send>(jobs: usize, threads: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = threads.clamp(1, jobs.max(1));
    let mut results: Vec<Option<T>> = (0..jobs).map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                let f = &f;
                s.spawn(move || (w..jobs).step_by(threads).map(|i| (i, f(i))).collect::<Vec<_>>())
            })
            .collect();
        for w in workers {
            for (i, r) in w.join().expect("prerouter worker thread panicked") {
                results[i] = Some(r);
            }
        }
    });
    results.into_iter().map(|r| r.expect("every job ran")).collect()
}
