//! Crossing the C boundary: panics caught, errors kept per thread as a string, C strings in and
//! out.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use moestream::{Error, Result};

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Runs `f`; on an error or a panic records the message for [`moestream_last_error`] and
/// returns `failed`.
pub(crate) fn guard<T>(failed: T, f: impl FnOnce() -> Result<T>) -> T {
    let message = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => return value,
        Ok(Err(e)) => e.to_string(),
        Err(panic) => {
            let what =
                panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            format!("internal error: {}", what.unwrap_or_else(|| "panic".into()))
        }
    };
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = Some(c));
    failed
}

/// A borrowed C string as UTF-8 (`what` names the argument in the error).
///
/// # Safety
/// `s` is NULL or points to a NUL-terminated string alive for `'a`.
pub(crate) unsafe fn str_arg<'a>(s: *const c_char, what: &str) -> Result<&'a str> {
    if s.is_null() {
        return Err(Error::InvalidArgument(format!("{what} is NULL")));
    }
    CStr::from_ptr(s).to_str().map_err(|_| Error::InvalidArgument(format!("{what} is not UTF-8")))
}

/// A string handed to C, to be released with [`moestream_string_free`].
pub(crate) fn owned_string(s: String) -> *mut c_char {
    c_text(&s).into_raw()
}

/// `text` as a C string (NUL bytes, which C cannot hold, dropped).
pub(crate) fn c_text(text: &str) -> CString {
    CString::new(text.replace('\0', "")).unwrap_or_default()
}

/// The message of the last failed call on this thread, or NULL when none failed yet. Valid
/// until the next failing call on the same thread; do not free it.
#[no_mangle]
pub extern "C" fn moestream_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
}

/// Frees a string returned by moestream (NULL is ignored).
///
/// # Safety
/// `s` is NULL or a string from this library, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn moestream_string_free(s: *mut c_char) {
    if !s.is_null() {
        let _ = catch_unwind(|| drop(CString::from_raw(s)));
    }
}

/// The library's version, e.g. "0.1.0" (static; do not free).
#[no_mangle]
pub extern "C" fn moestream_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
