//! The C ABI of moestream: opaque engine and session handles, loading with options, generation
//! with a cancellable token callback, sessions keeping a conversation's KV cache between calls, chat through the model's template, several conversations answered
//! together (`moestream_chat_batch`), scoring, and the last error as a string. Every function catches panics (none crosses the boundary); every allocation it
//! returns has a matching `*_free`. The header `include/moestream.h` is generated from this
//! crate by cbindgen and checked by `tests/header.rs`.
//!
//! Versions: every options or figures struct starts with `struct_size`, `sizeof` it as the app
//! was compiled (the `*_default` functions set it; set it yourself for `MoestreamStats`). Fields
//! are only appended, so an app built against an older header keeps working with a newer
//! library; a size the library does not know is an error, not a misread.
//!
//! Threading: a handle may move between threads but must be used by one thread at a time; calls
//! on different handles may run at once on different threads. Several conversations on one
//! engine run at once through `moestream_chat_batch` (one call, their steps shared). The token callback runs on the
//! calling thread, inside `moestream_generate` / `moestream_chat`, and must not call back into
//! the library with the same engine or session (other handles are fine). The last error is kept
//! per thread.

mod batch;
mod boundary;
mod chat_message;
mod engine;
mod generate;
mod score;
mod session;
mod sized;

pub use batch::{moestream_chat_batch, MoestreamBatchCallback};
pub use boundary::{moestream_last_error, moestream_string_free, moestream_version};
pub use chat_message::moestream_chat_message;
pub use engine::{
    moestream_engine_free, moestream_engine_load, moestream_load_options_default, MoestreamEngine,
    MoestreamLoadOptions, MOESTREAM_KV_F16, MOESTREAM_KV_F32, MOESTREAM_KV_Q4_0, MOESTREAM_KV_Q8_0,
    MOESTREAM_MTP_AVAILABLE, MOESTREAM_MTP_OFF, MOESTREAM_MTP_REQUIRED,
};
pub use generate::{
    moestream_chat, moestream_generate, moestream_generate_options_default, moestream_generate_options_for_model,
    MoestreamGenerateOptions, MoestreamStats, MoestreamTokenCallback, MOESTREAM_DRAFTS_MTP,
    MOESTREAM_DRAFTS_PROMPT_LOOKUP,
};
pub use score::{moestream_score, moestream_tokenize};
pub use session::{
    moestream_session_free, moestream_session_len, moestream_session_new, moestream_session_truncate, MoestreamSession,
};
