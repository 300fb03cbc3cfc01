//! Helpers shared by the C ABI's tests.
#![allow(dead_code)]

use std::ffi::{CStr, CString};

use moestream_c::*;

/// The calling thread's last error, or "?".
pub fn last_error() -> String {
    // SAFETY: moestream_last_error returns NULL or a NUL-terminated string valid until the next call.
    unsafe { moestream_last_error().as_ref().map_or("?".into(), |p| CStr::from_ptr(p).to_string_lossy().into()) }
}

/// The bundled model loaded with the default options (a panic naming the error otherwise).
pub fn load_bundled() -> *mut MoestreamEngine {
    load(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/moestream-tiny-moe"), None)
}

/// The model in `dir` loaded with the default options, `context` positions where given (a
/// panic naming the error otherwise).
pub fn load(dir: &str, context: Option<u32>) -> *mut MoestreamEngine {
    let dir = CString::new(dir).unwrap();
    // SAFETY: the default function fills the struct; `dir` outlives the load.
    unsafe {
        let mut load = std::mem::MaybeUninit::<MoestreamLoadOptions>::uninit();
        moestream_load_options_default(load.as_mut_ptr());
        let mut load = load.assume_init();
        load.model_dir = dir.as_ptr();
        if let Some(c) = context {
            load.context = c;
        }
        let engine = moestream_engine_load(&load);
        assert!(!engine.is_null(), "load: {}", last_error());
        engine
    }
}

/// `n` stats structs ready to be filled (`struct_size` set, the rest zero).
pub fn stats_structs(n: usize) -> Vec<MoestreamStats> {
    (0..n)
        .map(|_| {
            // SAFETY: MoestreamStats is plain old data, for which zero is a valid value.
            let mut s: MoestreamStats = unsafe { std::mem::zeroed() };
            s.struct_size = std::mem::size_of::<MoestreamStats>() as u32;
            s
        })
        .collect()
}
