//! One test of the running test binary again, in a child process of its own: for figures the
//! other tests of this process would disturb (its resident set).

use std::ffi::OsStr;
use std::process::Command;

/// Runs test `name` of this test binary in a child process with `env` set and returns its
/// stdout; panics, naming `case`, when the child fails.
pub fn run_child_test(name: &str, case: &str, env: &[(&str, &OsStr)]) -> String {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    for (key, value) in env {
        command.env(key, value);
    }
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{case}: the child failed\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The figures a child printed as `rss LABEL BYTES` lines, in order (the harness's `test NAME
/// ... ` may precede the first on its line).
pub fn rss_figures(stdout: &str) -> Vec<u64> {
    stdout
        .lines()
        .filter_map(|l| l.split_once("rss ").map(|(_, figures)| figures.split(' ').nth(1).unwrap().parse().unwrap()))
        .collect()
}

/// Fails unless the resident set after repeated loads and drops (`rss`, one figure per drop, at
/// least six) stays flat: the least of the last three may exceed the most of the first three by
/// `allowance` at most (a leak grows every time; allocator slack goes up and down).
pub fn assert_no_growth(case: &str, rss: &[u64], allowance: u64) {
    let mib = |b: u64| b as f64 / 1048576.0;
    let figures: Vec<String> = rss.iter().map(|&b| format!("{:.1}", mib(b))).collect();
    eprintln!("{case}: RSS after each drop (MiB): {}", figures.join(" "));
    assert!(rss.len() >= 6, "{case}: {} figures", rss.len());
    let first = *rss[..3].iter().max().unwrap();
    let last = *rss[rss.len() - 3..].iter().min().unwrap();
    assert!(
        last <= first + allowance,
        "{case}: RSS grew from {:.1} MiB (the most after the first three drops) to {:.1} MiB (the least after the last three); allowance {:.0} MiB: {}",
        mib(first),
        mib(last),
        mib(allowance),
        figures.join(" ")
    );
}
