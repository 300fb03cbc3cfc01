//! Tokenizing and teacher-forced scoring.

use std::ffi::c_char;

use moestream::Error;

use crate::boundary::{guard, str_arg};
use crate::engine::{engine_ref, MoestreamEngine};

/// Tokenizes `text` (with the model's special tokens) into `out` (up to `capacity` ids).
/// Returns the number of tokens, which may exceed `capacity` (call again with a larger buffer),
/// or -1 on failure. `out` may be NULL when `capacity` is 0.
///
/// # Safety
/// `engine` is a live handle; `text` NUL-terminated; `out` valid for `capacity` writes.
#[no_mangle]
pub unsafe extern "C" fn moestream_tokenize(
    engine: *mut MoestreamEngine,
    text: *const c_char,
    out: *mut u32,
    capacity: usize,
) -> i64 {
    guard(-1, || {
        let tokens = engine_ref(engine)?.engine.encode(str_arg(text, "text")?)?;
        if capacity > 0 {
            if out.is_null() {
                return Err(Error::InvalidArgument("out is NULL".into()));
            }
            let n = tokens.len().min(capacity);
            std::ptr::copy_nonoverlapping(tokens.as_ptr(), out, n);
        }
        Ok(tokens.len() as i64)
    })
}

/// Teacher-forces `tokens[0..n]` (n >= 2): writes `log p(tokens[i+1] | tokens[..=i])` to
/// `logprobs[0..n-1]` (if not NULL) and the perplexity to `perplexity` (if not NULL). Returns 0,
/// or -1 on failure.
///
/// # Safety
/// `engine` is a live handle; `tokens` valid for `n` reads; `logprobs` NULL or valid for `n-1`
/// writes; `perplexity` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn moestream_score(
    engine: *mut MoestreamEngine,
    tokens: *const u32,
    n: usize,
    logprobs: *mut f32,
    perplexity: *mut f64,
) -> i32 {
    guard(-1, || {
        let e = engine_ref(engine)?;
        if tokens.is_null() {
            return Err(Error::InvalidArgument("tokens is NULL".into()));
        }
        let score = e.engine.score(std::slice::from_raw_parts(tokens, n))?;
        if !logprobs.is_null() {
            std::ptr::copy_nonoverlapping(score.logprobs.as_ptr(), logprobs, score.logprobs.len());
        }
        if let Some(p) = perplexity.as_mut() {
            *p = score.perplexity;
        }
        Ok(0)
    })
}
