//! The expert store `experts.bin`: every routed expert of every MoE layer in one file, one
//! contiguous 4 KiB-aligned extent per expert, so one `pread` brings one expert.
//!
//! # File layout (all integers little-endian)
//!
//! **Fixed header**, 160 bytes ([`FIXED_HEADER_LEN`]):
//!
//! | offset | type | field |
//! | --- | --- | --- |
//! | 0 | `[u8; 8]` | magic `b"MOEXPRT1"` |
//! | 8 | u32 | format version: 1 for f16/int4 stores, 2 for GGUF-typed stores |
//! | 12 | u32 | fixed header length (160) |
//! | 16 | u64 | architecture hash (caller-defined) |
//! | 24 | u32 | `L`: number of MoE layers stored |
//! | 28 | u32 | `E`: experts per layer |
//! | 32 | u32 | hidden size |
//! | 36 | u32 | intermediate size |
//! | 40 | u32 | encoding: 0 = f16, 1 = int4 symmetric, 2 = int4 affine (version 1); 3 = GGUF blocks (version 2) |
//! | 44 | u32 | int4 group size (32 or 64; 0 for f16 and GGUF) |
//! | 48 | u64 | extent length (multiple of 4096, same for every expert) |
//! | 56 | u64 | data offset: file offset of the first extent |
//! | 64 | 24 B | gate_proj: offset u64, length u64 (within the extent), rows u32, cols u32 (zero in GGUF stores) |
//! | 88 | 24 B | up_proj: same fields |
//! | 112 | 24 B | down_proj: same fields |
//! | 136 | u64 | data length within an extent (`down.offset + down.len`; GGUF stores: the largest layer's) |
//! | 144 | 12 B | reserved (zero) |
//! | 156 | u32 | crc32 of bytes 0..156 |
//!
//! Then, from byte 160:
//!
//! * **layer table**: `L` × u32, the model layer index of each layer slot;
//! * **index**: `L·E` entries of 20 bytes, slot-major (entry `slot·E + expert`): extent offset
//!   u64, extent length u64, crc32 u32 of the whole extent (padding included);
//! * **type table** (GGUF stores only): `L` × 2 u32, per layer slot the ggml type number of
//!   gate and up, then of down;
//! * **region crc**: u32, crc32 of every byte from 0 up to here (fixed header, table, index);
//! * zero padding up to the data offset (`align_up(160 + 4L + 20LE (+ 8L) + 4, 4096)`).
//!
//! **Extents** follow, each at a 4096-aligned offset and `extent_len` bytes long (zero padded):
//! gate (`[intermediate, hidden]`), up (`[intermediate, hidden]`) and down (`[hidden,
//! intermediate]`) blobs back to back from extent offset 0, each in the blob format of
//! [`crate::quant`] for the store's [`WeightEncoding`](crate::quant::WeightEncoding) (segments
//! 256-aligned within the blob, blob lengths multiples of 256). See [`ExpertLayout`]. In a GGUF
//! store (`moestream convert FILE.gguf`) the blobs are the GGUF file's blocks of that expert,
//! unchanged, each `rows × row bytes` rounded up to 256 ([`ggml_extent`]), so a layer whose
//! types differ (Q4_K_M's down in Q6_K on some layers, Q4_K on others) keeps its own; the
//! extent length is the largest layer's. A build that predates version 2 refuses these stores
//! by version ([`StoreError::UnsupportedVersion`], "re-convert"); this build reads both.
//!
//! Checks at open, in order: magic ([`StoreError::BadMagic`]), length of the fixed header
//! ([`StoreError::Truncated`]), version, arch hash, fixed-header crc and consistency
//! ([`StoreError::IndexCorrupt`]), header region within the file (`Truncated`), region crc,
//! index entries (`IndexCorrupt`), every extent within the file (`Truncated`). Each read
//! verifies its extent's crc ([`StoreError::Checksum`]).

mod aligned;
mod decode;
mod error;
mod header;
mod layout;
mod positioned;
mod reader;
mod writer;

pub use aligned::AlignedBuf;
pub use decode::{decode_expert, DecodedExpert};
pub use error::StoreError;
pub use header::{IndexEntry, StoreInfo, FIXED_HEADER_LEN, FORMAT_VERSION, INDEX_ENTRY_LEN, MAGIC, MAX_DIM};
pub use layout::{ggml_extent, ExpertLayout, ProjectionLayout, StoreEncoding, EXTENT_ALIGN};
pub use positioned::{open_uncached, PositionedIo};
pub use reader::{ExpertStore, IoMode, OpenOptions};
pub use writer::{EncodedExpert, StoreWriter};
