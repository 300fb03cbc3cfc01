//! [`KvDtype`]: the element type of the KV cache.

/// Element type of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    /// Half precision (two per u32, packed and unpacked in f32 arithmetic): the default, half
    /// the memory and half the bytes read per decode step.
    #[default]
    F16,
    /// Single precision: bit-comparable with the f32 reference.
    F32,
}

impl KvDtype {
    /// Bytes of one cached element.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }

    /// `"f16"` or `"f32"`.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
        }
    }
}
