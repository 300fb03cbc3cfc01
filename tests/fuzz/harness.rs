//! Running mutants: seeded proptest runs, each mutant on its own thread under a watchdog, with
//! a panic hook that counts panics on every thread (the engine's I/O pool included).

use std::cell::Cell;
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, Once};
use std::time::Duration;

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

/// Panics seen on any thread since the test binary started.
static PANICS: AtomicUsize = AtomicUsize::new(0);
/// One mutant at a time, so a panic on a helper thread is charged to the mutant that ran it.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
/// Longest a mutant may take before it counts as a hang (a correct run takes about a second).
const HANG: Duration = Duration::from_secs(60);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

/// Mutants per input kind (`MOESTREAM_FUZZ_VERBOSE=1` prints each with its outcome): `ci` by default, `MOESTREAM_FUZZ_CASES` when set, or 50 × `ci` with
/// `MOESTREAM_FUZZ_LONG=1`.
pub fn cases(ci: u32) -> u32 {
    if let Some(n) = std::env::var("MOESTREAM_FUZZ_CASES").ok().and_then(|v| v.parse().ok()) {
        return n;
    }
    match std::env::var("MOESTREAM_FUZZ_LONG").as_deref() {
        Ok("1") => ci * 50,
        _ => ci,
    }
}

/// What an entry point did with a mutant: both are fine, only a panic, abort or hang is not.
pub type Outcome = Result<(), String>;

/// Runs `entry` on its own thread: `Ok` when it returned (a clean error or a correct run), a
/// failure when it panicked on any thread or did not return within [`HANG`].
pub fn guarded(entry: impl FnOnce() -> Outcome + Send + 'static) -> Result<Outcome, TestCaseError> {
    guarded_within(HANG, entry)
}

/// [`guarded`] with another hang limit.
pub fn guarded_within(
    hang: Duration,
    entry: impl FnOnce() -> Outcome + Send + 'static,
) -> Result<Outcome, TestCaseError> {
    count_panics();
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let before = PANICS.load(Ordering::SeqCst);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(entry());
    });
    let outcome = match rx.recv_timeout(hang) {
        Ok(outcome) => outcome,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return Err(TestCaseError::fail(format!("hang: no answer in {hang:?}")))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => return Err(TestCaseError::fail("panicked")),
    };
    let panics = PANICS.load(Ordering::SeqCst) - before;
    if panics > 0 {
        return Err(TestCaseError::fail(format!("{panics} panic(s) on other threads; outcome {outcome:?}")));
    }
    Ok(outcome)
}

/// Runs `cases(ci)` mutants drawn from `strategy` with a seed fixed by `name` through `test`;
/// a failing mutant is shrunk to the smallest one that still fails, and reported.
pub fn fuzz<S>(name: &str, ci: u32, strategy: S, test: impl Fn(S::Value) -> Result<Outcome, TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    let seed = name.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3));
    let config = Config {
        cases: cases(ci),
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 200,
        ..Config::default()
    };
    let (ok, refused) = (Cell::new(0usize), Cell::new(0usize));
    let mut runner = TestRunner::new(config);
    let verbose = std::env::var_os("MOESTREAM_FUZZ_VERBOSE").is_some();
    let result = runner.run(&strategy, |mutant| {
        let shown = verbose.then(|| format!("{mutant:?}"));
        let outcome = test(mutant)?;
        if let Some(shown) = shown {
            eprintln!("{name}: {shown}\n    → {outcome:?}");
        }
        let count = if outcome.is_ok() { &ok } else { &refused };
        count.set(count.get() + 1);
        Ok(())
    });
    let (ok, refused) = (ok.get(), refused.get());
    eprintln!("fuzz {name}: {} mutants, {ok} ran, {refused} refused with a typed error", ok + refused);
    if let Err(e) = result {
        panic!("fuzz {name}: {e}");
    }
    // A long run where nothing ran is refusing every mutant for one unrelated reason (as when
    // dropped engines' GPU memory was never given back), so it reaches none of the code it tests.
    assert!(ok > 0 || ok + refused < 500, "fuzz {name}: {refused} mutants and none ran: a hollow run");
}
