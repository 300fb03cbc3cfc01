//! The int4 weight format: group-wise quantization, nibble packing, CPU dequantization and the
//! byte layout that GPU kernels and the expert store read.
//!
//! # Quantization
//!
//! A weight matrix is row-major `[rows, cols]` f32 (HF linear weights are `[out, in]`, so `cols`
//! is the input dimension). Each row is cut into groups of `group_size` (32 or 64) consecutive
//! columns (the last group of a row is shorter when `cols` is not a multiple of `group_size`;
//! `cols` must be a multiple of 8). Every group gets its own f16 scale (and,
//! for the affine scheme, its own f16 offset called *min*). A 4-bit code `n` in `0..=15`
//! (a *nibble*) is stored per weight and decodes as
//!
//! * [`Int4Scheme::Affine`] (the default): `value = f32(n) * scale + min`;
//! * [`Int4Scheme::Symmetric`]: `value = (f32(n) - 8.0) * scale`, i.e. the signed code
//!   `q = n - 8` in `-8..=7` is stored in offset binary (no sign extension needed).
//!
//! Both decode formulas are evaluated in f32 with the f16 scale/min widened to f32 first.
//! How the scales are chosen is documented on [`quantize`].
//!
//! # Bit layout (what the WGSL kernels read)
//!
//! A serialized matrix is one byte blob with three segments, described by [`Int4Layout`]; every
//! segment starts at a multiple of 256 bytes from the blob start ([`SEGMENT_ALIGN`]), and the
//! blob length is a multiple of 256 so blobs can be concatenated and bound at aligned offsets:
//!
//! 1. **packed** at `packed_offset` (always 0): `rows * cols / 8` little-endian `u32` words,
//!    row-major: row `r` owns words `r * cols/8 .. (r+1) * cols/8`; word `w` of row `r` holds
//!    columns `8w .. 8w+7`, column `8w + j` in bits `4j .. 4j+3` (low nibble first). Read it as
//!    `n = (word >> (4u * j)) & 0xFu`. In bytes: byte `4w + k` of a row holds column `8w + 2k`
//!    in its low nibble and column `8w + 2k + 1` in its high nibble.
//! 2. **scales** at `scales_offset`: `rows * ceil(cols/group_size)` little-endian f16, row-major
//!    `[rows, ceil(cols/group_size)]`: the scale of column `c` of row `r` is entry
//!    `r * ceil(cols/group_size) + c / group_size`. The segment is padded with zero bytes to a
//!    multiple of 4 bytes, so a kernel reads it as `array<u32>`: entry `i` is the low half
//!    (`unpack2x16float(words[i / 2]).x`) when `i` is even and the high half (`.y`) when odd.
//! 3. **mins** at `mins_offset` (affine only; zero length for symmetric): same shape, order and
//!    padding as the scales.
//!
//! Padding bytes between and after segments are zero.
//!
//! # 16-bit stores
//!
//! [`WeightEncoding::F16`] stores a matrix as plain row-major little-endian f16 at blob offset 0,
//! padded with zeros to a multiple of 256 bytes.

mod encoding;
mod error;
pub mod ggml_type;
pub mod kv_dtype;
mod layout;
mod matrix;
mod pack;
mod params;
mod q4_0;
mod scale_search;
mod serialize;

pub use encoding::WeightEncoding;
pub use error::QuantError;
pub use ggml_type::GgmlType;
pub use kv_dtype::KvDtype;
pub use layout::{layout, Int4Layout, SEGMENT_ALIGN};
pub use matrix::{quantize, Int4Matrix};
pub use pack::{pack_row, unpack_nibble};
pub use params::{Int4Scheme, QuantParams};
pub use q4_0::{write_q4_0_as_int4, Q4_0_AS_INT4};
