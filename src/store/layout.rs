//! [`ExpertLayout`]: where the gate, up and down blobs lie inside one expert extent.

use crate::quant::GgmlType;
use crate::quant::{Int4Layout, QuantError, WeightEncoding};

/// Alignment of every extent's file offset and length (for O_DIRECT).
pub const EXTENT_ALIGN: usize = 4096;

/// How a store's experts are encoded.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StoreEncoding {
    /// Every projection of every layer in one moestream encoding, laid out by [`ExpertLayout`]
    /// (format version 1).
    Uniform(WeightEncoding),
    /// GGUF blocks exactly as the source file stored them (format version 2): per stored layer,
    /// in layer-table order, the ggml type of gate and up and the ggml type of down, laid out
    /// by [`ggml_extent`].
    Ggml(Vec<[GgmlType; 2]>),
}

impl StoreEncoding {
    /// The format version a store of this encoding is written with: 1 for uniform encodings
    /// (readable by builds that predate GGUF stores), 2 for GGUF blocks.
    pub fn version(&self) -> u32 {
        match self {
            StoreEncoding::Uniform(_) => 1,
            StoreEncoding::Ggml(_) => 2,
        }
    }

    /// Human-readable name: `int4-affine-g32`, `f16`, or `gguf` with the distinct type pairs
    /// (`gguf:q4_k+q6_k,q4_k+q4_k`).
    pub fn name(&self) -> String {
        match self {
            StoreEncoding::Uniform(e) => e.name(),
            StoreEncoding::Ggml(types) => {
                let mut pairs: Vec<String> = Vec::new();
                for [a, b] in types {
                    let p = format!("{}+{}", a.name(), b.name()).to_lowercase();
                    if !pairs.contains(&p) {
                        pairs.push(p);
                    }
                }
                format!("gguf:{}", pairs.join(","))
            }
        }
    }
}

/// Byte offsets of gate, up and down within the extent of a GGUF expert whose gate and up are
/// `types[0]` and down `types[1]`, and its data length: the three blobs back to back, each
/// `rows × row bytes` rounded up to 256 (the same layout as its GPU slot). `None` when a width
/// is zero or not a whole number of the type's blocks.
pub fn ggml_extent(types: [GgmlType; 2], hidden: usize, inter: usize) -> Option<([usize; 3], usize)> {
    let blob = |t: GgmlType, rows: usize, cols: usize| {
        (rows > 0 && cols > 0 && cols.is_multiple_of(t.block_size()))
            .then(|| (rows * t.row_bytes(cols)).next_multiple_of(256))
    };
    let a = blob(types[0], inter, hidden)?;
    let d = blob(types[1], hidden, inter)?;
    Some(([0, a, 2 * a], 2 * a + d))
}

/// One projection's blob inside an extent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ProjectionLayout {
    /// Byte offset of the blob from the extent start (multiple of 256).
    pub offset: usize,
    /// Blob length in bytes (multiple of 256).
    pub len: usize,
    /// Rows of the weight (output dimension).
    pub rows: usize,
    /// Columns of the weight (input dimension).
    pub cols: usize,
}

impl ProjectionLayout {
    /// The blob's int4 segment layout (offsets relative to the blob, not the extent), if int4.
    pub fn int4_layout(&self, encoding: WeightEncoding) -> Option<Int4Layout> {
        match encoding {
            WeightEncoding::F16 => None,
            WeightEncoding::Int4(p) => Int4Layout::new(self.rows, self.cols, p).ok(),
        }
    }

    /// The blob's bytes within an extent.
    pub fn slice<'a>(&self, extent: &'a [u8]) -> &'a [u8] {
        &extent[self.offset..self.offset + self.len]
    }
}

/// The sub-layout shared by every expert extent of a store.
///
/// gate and up are `[intermediate, hidden]`, down is `[hidden, intermediate]`; the blobs follow
/// each other in that order from extent offset 0, each encoded with `encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExpertLayout {
    /// Storage encoding of all three projections.
    pub encoding: WeightEncoding,
    /// Model hidden size.
    pub hidden: usize,
    /// Expert intermediate (FFN) size.
    pub intermediate: usize,
    /// gate_proj blob.
    pub gate: ProjectionLayout,
    /// up_proj blob.
    pub up: ProjectionLayout,
    /// down_proj blob.
    pub down: ProjectionLayout,
    /// Bytes holding data (`down.offset + down.len`).
    pub data_len: usize,
    /// Extent length: `data_len` rounded up to 4096.
    pub extent_len: usize,
}

impl ExpertLayout {
    /// Computes the layout; fails if the shapes do not suit the encoding.
    pub fn new(encoding: WeightEncoding, hidden: usize, intermediate: usize) -> Result<Self, QuantError> {
        let proj = |offset: usize, rows: usize, cols: usize| -> Result<ProjectionLayout, QuantError> {
            Ok(ProjectionLayout { offset, len: encoding.segment_bytes(rows, cols)?, rows, cols })
        };
        let gate = proj(0, intermediate, hidden)?;
        let up = proj(gate.offset + gate.len, intermediate, hidden)?;
        let down = proj(up.offset + up.len, hidden, intermediate)?;
        let data_len = down.offset + down.len;
        Ok(ExpertLayout {
            encoding,
            hidden,
            intermediate,
            gate,
            up,
            down,
            data_len,
            extent_len: data_len.div_ceil(EXTENT_ALIGN) * EXTENT_ALIGN,
        })
    }

    /// The three projections with their HF names, in extent order.
    pub fn projections(&self) -> [(&'static str, ProjectionLayout); 3] {
        [("gate_proj", self.gate), ("up_proj", self.up), ("down_proj", self.down)]
    }
}
