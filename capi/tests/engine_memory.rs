//! `moestream_engine_load` / `moestream_engine_free` give the engine's memory back: ten loads,
//! each generating a few tokens, then freed, leave the RSS where the first free left it (within a
//! small allowance), resident and streamed. Each case runs in a child process (this test binary
//! re-run with `--exact load_and_free_child`), as the tests of one binary share a process.

use std::ffi::{c_char, CStr, CString};
use std::ptr::null_mut;

use moestream::util::peak_rss::current_rss_bytes;
use moestream_c::*;

#[path = "../../tests/common/child.rs"]
mod child;
use child::{assert_no_growth, rss_figures, run_child_test};

/// The case a child runs (unset in the parent).
const CASE: &str = "MOESTREAM_MEMORY_CASE";
/// Loads per child.
const LOADS: usize = 10;
/// How far the RSS after the last free may exceed that after the first (allocator slack; the
/// bundled model's weights alone are ~38 MiB).
const ALLOWANCE: u64 = 8 << 20;

fn last_error() -> String {
    // SAFETY: moestream_last_error returns NULL or a NUL-terminated string valid until the next call.
    unsafe { moestream_last_error().as_ref().map_or("?".into(), |p| CStr::from_ptr(p).to_string_lossy().into()) }
}

/// The child: ten loads, each generating four tokens, then freed; prints `rss N BYTES` after each
/// free. Does nothing in the parent's own run of the tests.
#[test]
fn load_and_free_child() {
    let Ok(case) = std::env::var(CASE) else { return };
    let dir = CString::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/moestream-tiny-moe")).unwrap();
    let prompt = CString::new("The jury said").unwrap();
    for load in 1..=LOADS {
        // SAFETY: every pointer is NULL or points to a live value of the type the header names;
        // the engine is freed once, after its last use.
        unsafe {
            let mut options = std::mem::zeroed::<MoestreamLoadOptions>();
            moestream_load_options_default(&mut options);
            options.model_dir = dir.as_ptr();
            options.context = 256;
            options.expert_slots = if case == "streamed" { 8 } else { 0 };
            let engine = moestream_engine_load(&options);
            assert!(!engine.is_null(), "load: {}", last_error());
            let mut generate = std::mem::zeroed::<MoestreamGenerateOptions>();
            moestream_generate_options_default(&mut generate);
            generate.max_tokens = 4;
            let text: *mut c_char =
                moestream_generate(engine, null_mut(), prompt.as_ptr(), &generate, None, null_mut(), null_mut());
            assert!(!text.is_null(), "generate: {}", last_error());
            moestream_string_free(text);
            moestream_engine_free(engine);
        }
        println!("rss {load} {}", current_rss_bytes());
    }
}

fn check(case: &str) {
    let stdout = run_child_test("load_and_free_child", case, &[(CASE, case.as_ref())]);
    let rss = rss_figures(&stdout);
    assert_eq!(rss.len(), LOADS, "{case}: one figure per load\n{stdout}");
    assert_no_growth(&format!("C API, {case}"), &rss, ALLOWANCE);
}

#[test]
fn freed_resident_engines_give_their_memory_back() {
    check("resident");
}

#[test]
fn freed_streamed_engines_give_their_memory_back() {
    check("streamed");
}
