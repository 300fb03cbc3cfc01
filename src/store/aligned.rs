//! [`AlignedBuf`]: a zeroed byte buffer whose start is 4096-byte aligned (for O_DIRECT reads).

use std::ops::{Deref, DerefMut};

/// A heap byte buffer whose first byte is aligned to [`AlignedBuf::ALIGN`].
///
/// Built safely by over-allocating a `Vec<u8>` and slicing at the first aligned address; the
/// vector never grows, so the alignment holds for the buffer's life (moving the `AlignedBuf`
/// does not move its heap storage). Not `Clone` on purpose (a clone would lose the alignment).
#[derive(Debug)]
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// Alignment of the buffer start in bytes.
    pub const ALIGN: usize = 4096;

    /// A zeroed buffer of `len` bytes.
    pub fn new(len: usize) -> Self {
        let storage = vec![0u8; len + Self::ALIGN];
        let addr = storage.as_ptr() as usize;
        let start = (Self::ALIGN - addr % Self::ALIGN) % Self::ALIGN;
        AlignedBuf { storage, start, len }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has zero length.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}
