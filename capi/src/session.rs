//! Session handles: a sequence whose KV cache lives between calls, so a conversation's next turn
//! (or a continued text) prefills only what is new.

use moestream::runtime::Session;
use moestream::Error;

use crate::boundary::guard;
use crate::engine::{engine_ref, MoestreamEngine};

/// A sequence and its KV cache (opaque), usable only with the engine that made it.
pub struct MoestreamSession {
    pub(crate) session: Session,
}

/// A new empty session of `engine`; NULL on failure (e.g. its KV cache does not fit beside the
/// live sessions). Free with `moestream_session_free` before freeing the engine.
///
/// # Safety
/// `engine` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn moestream_session_new(engine: *mut MoestreamEngine) -> *mut MoestreamSession {
    guard(std::ptr::null_mut(), || {
        let session = engine_ref(engine)?.engine.new_session()?;
        Ok(Box::into_raw(Box::new(MoestreamSession { session })))
    })
}

/// Frees a session (NULL is ignored).
///
/// # Safety
/// `session` is NULL or a handle from `moestream_session_new`, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn moestream_session_free(session: *mut MoestreamSession) {
    if !session.is_null() {
        guard((), || {
            drop(Box::from_raw(session));
            Ok(())
        });
    }
}

/// Tokens in the session (prompts and generated tokens so far); 0 for NULL.
///
/// # Safety
/// `session` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn moestream_session_len(session: *const MoestreamSession) -> usize {
    session.as_ref().map_or(0, |s| s.session.len())
}

/// Keeps the first `len` tokens (to regenerate a reply, or forget the conversation with 0); the
/// cache of the kept prefix stays valid. Returns 0, or -1 when `session` is NULL.
///
/// # Safety
/// `session` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn moestream_session_truncate(session: *mut MoestreamSession, len: usize) -> i32 {
    guard(-1, || {
        let s = session.as_mut().ok_or_else(|| Error::InvalidArgument("session is NULL".into()))?;
        s.session.truncate(len);
        Ok(0)
    })
}
