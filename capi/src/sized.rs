//! Option and figure structs that carry their own size, so the library and an app built
//! against another version of the header keep agreeing: each struct starts with `struct_size`
//! (`sizeof` the struct as the app was compiled; the `*_default` functions set it). Fields are
//! only ever appended: the library reads an older, smaller struct as far as it goes and takes
//! its defaults for the rest, writes figures only as far as the app's struct goes, and refuses a
//! size it does not know (smaller than the first version, larger than its own) by name.

use moestream::{Error, Result};

/// A struct of the C API that starts with its `struct_size` (a `u32`).
pub(crate) trait SizedStruct: Copy {
    /// The struct's name in errors.
    const NAME: &'static str;
    /// Its size in the first version of the API (the smallest the library accepts). Today's
    /// structs are that first version; when a field is appended, this becomes
    /// `offset_of!(Self, that_field)` (rounded up as C would pad it) and stays there.
    const FIRST_SIZE: usize;
}

/// The size a caller's struct says it has, checked against what this library knows.
///
/// # Safety
/// `p` points to a struct of type `T` as some version of the header declares it, whose first
/// field is its `struct_size`.
pub(crate) unsafe fn caller_size<T: SizedStruct>(p: *const T) -> Result<usize> {
    let size = (p as *const u32).read() as usize;
    if size < T::FIRST_SIZE || size > std::mem::size_of::<T>() {
        return Err(Error::InvalidArgument(format!(
            "{}.struct_size is {size}: expected sizeof({}) from this or an older moestream.h ({}..={} bytes; \
             fill it with its *_default function or set it)",
            T::NAME,
            T::NAME,
            T::FIRST_SIZE,
            std::mem::size_of::<T>()
        )));
    }
    Ok(size)
}

/// Refuses an output struct at `p` whose `struct_size` is wrong before any work is done; NULL
/// (no output asked for) passes.
///
/// # Safety
/// As [`caller_size`] where `p` is not NULL.
pub(crate) unsafe fn check_output<T: SizedStruct>(p: *mut T) -> Result<()> {
    if !p.is_null() {
        caller_size(p)?;
    }
    Ok(())
}

/// The caller's struct at `p`, the fields its version lacks taken from `defaults`.
///
/// # Safety
/// As [`caller_size`]; the struct's first `struct_size` bytes are readable.
pub(crate) unsafe fn read_sized<T: SizedStruct>(p: *const T, defaults: T) -> Result<T> {
    let size = caller_size(p)?;
    let mut out = defaults;
    std::ptr::copy_nonoverlapping(p as *const u8, &mut out as *mut T as *mut u8, size);
    Ok(out)
}

/// Writes `value` into the caller's struct at `p`, as far as its version goes (its
/// `struct_size` kept).
///
/// # Safety
/// As [`caller_size`]; the struct's first `struct_size` bytes are writable.
pub(crate) unsafe fn write_sized<T: SizedStruct>(p: *mut T, value: T) -> Result<()> {
    let size = caller_size(p)?;
    let bytes = &value as *const T as *const u8;
    // Its struct_size stays the caller's.
    std::ptr::copy_nonoverlapping(bytes.add(4), (p as *mut u8).add(4), size - 4);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A struct's second version: `b` appended to the first's `struct_size` and `a`.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq)]
    struct V2 {
        struct_size: u32,
        a: u32,
        b: u64,
    }

    impl SizedStruct for V2 {
        const NAME: &'static str = "V2";
        const FIRST_SIZE: usize = 8;
    }

    #[repr(C)]
    #[derive(Clone, Copy)]
    struct V1 {
        struct_size: u32,
        a: u32,
    }

    const DEFAULTS: V2 = V2 { struct_size: 16, a: 1, b: 99 };

    #[test]
    fn an_older_struct_is_read_and_written_as_far_as_it_goes() {
        let old = V1 { struct_size: 8, a: 7 };
        let read = unsafe { read_sized(&old as *const V1 as *const V2, DEFAULTS) }.unwrap();
        assert_eq!((read.a, read.b), (7, 99));
        let mut out = V1 { struct_size: 8, a: 0 };
        unsafe { write_sized(&mut out as *mut V1 as *mut V2, V2 { struct_size: 16, a: 5, b: 6 }) }.unwrap();
        assert_eq!((out.struct_size, out.a), (8, 5));
        let new = V2 { struct_size: 16, a: 2, b: 3 };
        assert_eq!(unsafe { read_sized(&new, DEFAULTS) }.unwrap(), new);
    }

    #[test]
    fn unknown_sizes_are_refused_by_name() {
        for size in [0u32, 4, 24] {
            let s = V2 { struct_size: size, a: 0, b: 0 };
            let e = unsafe { read_sized(&s, DEFAULTS) }.unwrap_err().to_string();
            assert!(e.contains("V2.struct_size") && e.contains(&size.to_string()), "{e}");
        }
    }
}
