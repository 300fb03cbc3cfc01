//! The C ABI of moestream: opaque engine and session handles, loading with options, generation
//! with a cancellable token callback, sessions keeping a conversation's KV cache between calls, chat through the model's template, scoring, and the last error as
//! a string. Every function catches panics (none crosses the boundary); every allocation it
//! returns has a matching `*_free`. The header `include/moestream.h` is generated from this
//! crate by cbindgen and checked by `tests/header.rs`.
//!
//! Threading: a handle may move between threads but must be used by one thread at a time.

mod boundary;
mod engine;
mod generate;
mod score;
mod session;

pub use boundary::{moestream_last_error, moestream_string_free, moestream_version};
pub use engine::{
    moestream_engine_free, moestream_engine_load, moestream_load_options_default, MoestreamEngine, MoestreamLoadOptions,
};
pub use generate::{
    moestream_chat, moestream_generate, moestream_generate_options_default, MoestreamGenerateOptions, MoestreamStats,
    MoestreamTokenCallback,
};
pub use score::{moestream_score, moestream_tokenize};
pub use session::{
    moestream_session_free, moestream_session_len, moestream_session_new, moestream_session_truncate, MoestreamSession,
};
