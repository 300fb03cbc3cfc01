//! Weight matrices on the GPU, split by rows into chunks that each fit one storage binding.

use super::weight_tiles;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::HostTensor;
use crate::quant::GgmlType;
use crate::quant::{write_q4_0_as_int4, Int4Layout, Int4Matrix, Int4Scheme, QuantParams, WeightEncoding, Q4_0_AS_INT4};

/// How weights are stored on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// 32-bit floats (exact comparison with the CPU reference).
    F32,
    /// IEEE halves packed two per 32-bit word.
    F16,
    /// Group-quantized 4-bit weights (see [`crate::quant`] for the layout).
    Int4(QuantParams),
    /// A ggml block type (or BF16) exactly as a GGUF file stores it, rows of blocks back to
    /// back (`shaders/weights_ggml.wgsl`); never F32 or F16, which are [`WeightFormat::F32`] and
    /// [`WeightFormat::F16`] byte for byte ([`WeightFormat::of_ggml`]).
    Ggml(GgmlType),
    /// Blocks of a ggml type with zero bytes inserted ([`PaddedBlock::of`]) so that the decode
    /// kernels' loads are aligned, the same values ([`WeightFormat::for_gpu`]): Q6_K in 224
    /// bytes, every block and field on 16 bytes, for 16-byte loads (`GGML_Q6_K_PADDED`,
    /// shaders/weights_q6_k.wgsl: Q4_K_M's lm_head and down experts); Q8_0 in 36, its codes on a
    /// word boundary, for word loads (`GGML_Q8_0_PADDED`, shaders/weights_q8_0.wgsl); MXFP4 in
    /// 20, likewise (`GGML_MXFP4_PADDED`: gpt-oss's experts).
    Padded(GgmlType),
}

/// Where a [`WeightFormat::Padded`] block puts its zeros: the stored block's bytes from `split`
/// on move to `split + (bytes - stored size)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PaddedBlock {
    /// Bytes of the padded block.
    pub bytes: usize,
    /// Offset in the stored block where the zeros go.
    pub split: usize,
}

impl PaddedBlock {
    /// The padding of type `t`'s blocks, for the types that have one: Q6_K's 210 bytes then 14
    /// zeros (+6.7%), Q8_0's f16 d, 2 zeros, then its 32 codes (+5.9%), MXFP4's exponent byte,
    /// 3 zeros, then its 16 code bytes (+17.6%).
    pub fn of(t: GgmlType) -> Option<PaddedBlock> {
        match t {
            GgmlType::Q6K => Some(PaddedBlock { bytes: 224, split: 210 }),
            GgmlType::Q8_0 => Some(PaddedBlock { bytes: 36, split: 2 }),
            GgmlType::Mxfp4 => Some(PaddedBlock { bytes: 20, split: 1 }),
            _ => None,
        }
    }

    fn of_padded(t: GgmlType) -> PaddedBlock {
        PaddedBlock::of(t).expect("WeightFormat::Padded holds a type with a padding")
    }
}

/// Where a blob's segments start, in the units the kernels index (`WMat` in the WGSL readers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlobOffsets {
    /// Weight data: f32 / f16 element index, or packed-word index for int4.
    pub data: u32,
    /// f16 index of the scales (int4 only).
    pub scales: u32,
    /// f16 index of the mins (affine int4 only).
    pub mins: u32,
}

impl BlobOffsets {
    /// The offsets shifted by `byte_offset` bytes (a multiple of 4) within a larger buffer.
    pub fn shifted(self, format: WeightFormat, byte_offset: usize) -> BlobOffsets {
        let data_unit = match format {
            WeightFormat::F16 => 2,
            WeightFormat::Ggml(_) | WeightFormat::Padded(_) => 1,
            _ => 4,
        };
        BlobOffsets {
            data: self.data + (byte_offset / data_unit) as u32,
            scales: self.scales + (byte_offset / 2) as u32,
            mins: self.mins + (byte_offset / 2) as u32,
        }
    }
}

impl WeightFormat {
    /// The shader defines selecting this format's weight reader.
    pub fn defines(self) -> Vec<&'static str> {
        match self {
            WeightFormat::F32 => vec![],
            WeightFormat::F16 => vec!["F16"],
            WeightFormat::Int4(p) => {
                let mut d = vec!["INT4"];
                if p.scheme == Int4Scheme::Symmetric {
                    d.push("INT4_SYM");
                }
                if p.group_size == 64 {
                    d.push("G64");
                }
                d
            }
            WeightFormat::Ggml(t) => vec!["GGML", crate::gpu::shader::GGML_DEFINES[ggml_reader(t)]],
            WeightFormat::Padded(t) => vec!["GGML", crate::gpu::shader::GGML_DEFINES[padded_reader(t)]],
        }
    }

    /// The format of a GGUF tensor of type `t` as the file stores it (F32 and F16 are the plain
    /// formats).
    pub fn of_ggml(t: GgmlType) -> WeightFormat {
        match t {
            GgmlType::F32 => WeightFormat::F32,
            GgmlType::F16 => WeightFormat::F16,
            t => WeightFormat::Ggml(t),
        }
    }

    /// The format the GPU holds GGUF weights stored as `self` in, every weight the same value
    /// ([`write_gguf_blob`]): Q4_0 as the int4 it exactly is ([`Q4_0_AS_INT4`], for the int4
    /// kernels' aligned loads rather than 18-byte blocks), Q6_K, Q8_0 and MXFP4 in padded blocks
    /// ([`WeightFormat::Padded`]), every other format as stored.
    pub fn for_gpu(self) -> WeightFormat {
        match self {
            WeightFormat::Ggml(GgmlType::Q4_0) => WeightFormat::Int4(Q4_0_AS_INT4),
            WeightFormat::Ggml(t) if PaddedBlock::of(t).is_some() => WeightFormat::Padded(t),
            f => f,
        }
    }

    /// Whether this format's `WIDE` reader loads through the weights' second binding as vec4s
    /// (`w4`), which the `WIDE` kernels then bind: all but padded Q8_0 and MXFP4, whose 36- and
    /// 20-byte blocks start on words only and are read a word at a time.
    pub fn wide_binds_vec4(self) -> bool {
        !matches!(self, WeightFormat::Padded(GgmlType::Q8_0 | GgmlType::Mxfp4))
    }

    /// Whether this is `stored` or the format the GPU holds it in ([`WeightFormat::for_gpu`]).
    pub fn is_gpu_form_of(self, stored: WeightFormat) -> bool {
        self == stored || self == stored.for_gpu()
    }

    /// Human-readable name (`f32`, `f16`, `int4-affine-g32`, ...).
    pub fn name(self) -> String {
        match self {
            WeightFormat::F32 => "f32".into(),
            WeightFormat::F16 => WeightEncoding::F16.name(),
            WeightFormat::Int4(p) => WeightEncoding::Int4(p).name(),
            WeightFormat::Ggml(t) => t.name().to_lowercase(),
            WeightFormat::Padded(t) => format!("{}-padded", t.name().to_lowercase()),
        }
    }

    /// Bytes of a `[rows, cols]` blob (a multiple of 256).
    pub fn blob_bytes(self, rows: usize, cols: usize) -> Result<usize> {
        match self {
            WeightFormat::F32 => Ok((rows * cols * 4).next_multiple_of(256)),
            WeightFormat::F16 => Ok(WeightEncoding::F16.segment_bytes(rows, cols).map_err(quant_err)?),
            WeightFormat::Int4(p) => Ok(WeightEncoding::Int4(p).segment_bytes(rows, cols).map_err(quant_err)?),
            WeightFormat::Ggml(t) => Ok((rows * whole_blocks(t, cols)? * t.type_size()).next_multiple_of(256)),
            WeightFormat::Padded(t) => {
                Ok((rows * whole_blocks(t, cols)? * PaddedBlock::of_padded(t).bytes).next_multiple_of(256))
            }
        }
    }

    /// Segment offsets of a `[rows, cols]` blob relative to its start.
    pub fn offsets(self, rows: usize, cols: usize) -> Result<BlobOffsets> {
        Ok(match self {
            WeightFormat::Int4(p) => {
                let l = Int4Layout::new(rows, cols, p).map_err(quant_err)?;
                BlobOffsets { data: 0, scales: (l.scales_offset / 2) as u32, mins: (l.mins_offset / 2) as u32 }
            }
            _ => BlobOffsets::default(),
        })
    }

    /// Encodes a row-major `[rows, cols]` matrix as a blob (quantizing for int4).
    pub fn encode(self, values: &[f32], rows: usize, cols: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.blob_bytes(rows, cols)?];
        match self {
            WeightFormat::F32 => out[..values.len() * 4].copy_from_slice(bytemuck::cast_slice(values)),
            WeightFormat::F16 => WeightEncoding::F16.encode(values, rows, cols, &mut out).map_err(quant_err)?,
            WeightFormat::Int4(p) => WeightEncoding::Int4(p).encode(values, rows, cols, &mut out).map_err(quant_err)?,
            WeightFormat::Ggml(t) => return Err(not_a_quantizer(t)),
            WeightFormat::Padded(t) => return Err(not_a_quantizer(t)),
        }
        Ok(out)
    }

    /// The format of a store encoding.
    pub fn from_encoding(e: WeightEncoding) -> WeightFormat {
        match e {
            WeightEncoding::F16 => WeightFormat::F16,
            WeightEncoding::Int4(p) => WeightFormat::Int4(p),
        }
    }

    /// The store encoding of this format (`None` for f32, which stores do not hold).
    pub fn encoding(self) -> Option<WeightEncoding> {
        match self {
            WeightFormat::F32 | WeightFormat::Ggml(_) | WeightFormat::Padded(_) => None,
            WeightFormat::F16 => Some(WeightEncoding::F16),
            WeightFormat::Int4(p) => Some(WeightEncoding::Int4(p)),
        }
    }
}

/// `e` (an encoding error: a non-finite weight, a value beyond f16) with the weights it
/// concerns named first.
pub fn naming(what: &str, e: Error) -> Error {
    match e {
        Error::UnsupportedConfig(m) => Error::UnsupportedConfig(format!("{what}: {m}")),
        e => e,
    }
}

fn quant_err(e: crate::quant::QuantError) -> Error {
    Error::UnsupportedConfig(e.to_string())
}

fn not_a_quantizer(t: GgmlType) -> Error {
    Error::UnsupportedConfig(format!(
        "moestream reads {} weights from GGUF files but does not quantize to it",
        t.name()
    ))
}

/// The blocks of type `t` in a row of `cols` values, if that is a whole number.
fn whole_blocks(t: GgmlType, cols: usize) -> Result<usize> {
    if !cols.is_multiple_of(t.block_size()) {
        return Err(Error::UnsupportedConfig(format!("{cols} columns is not a whole number of {} blocks", t.name())));
    }
    Ok(cols / t.block_size())
}

/// The bytes of a row of `t` blocks, if `bytes` is a `[rows, cols]` matrix of them.
fn ggml_row_bytes(label: &str, rows: usize, cols: usize, t: GgmlType, bytes: &[u8]) -> Result<usize> {
    let row_bytes = t.row_bytes(cols);
    if !cols.is_multiple_of(t.block_size()) || bytes.len() != rows * row_bytes {
        return Err(Error::InvalidArgument(format!(
            "{label}: {} bytes is not a [{rows}, {cols}] {} matrix",
            bytes.len(),
            t.name()
        )));
    }
    Ok(row_bytes)
}

/// Writes the `[rows, cols]` matrix of ggml type `t` whose GGUF bytes are `bytes` into `out`
/// as a whole blob (padding zeroed) of `WeightFormat::of_ggml(t).for_gpu()`: Q4_0 repacked as
/// int4, Q6_K and Q8_0 blocks padded ([`PaddedBlock`]), other types copied. Fails when
/// `bytes` is not such a matrix or `out` is not the blob's size.
pub fn write_gguf_blob(t: GgmlType, rows: usize, cols: usize, bytes: &[u8], out: &mut [u8]) -> Result<()> {
    let format = WeightFormat::of_ggml(t).for_gpu();
    let blob_bytes = format.blob_bytes(rows, cols)?;
    ggml_row_bytes(t.name(), rows, cols, t, bytes)?;
    if out.len() != blob_bytes {
        return Err(Error::InvalidArgument(format!(
            "a [{rows}, {cols}] {} blob is {blob_bytes} bytes, not {}",
            format.name(),
            out.len()
        )));
    }
    match format {
        WeightFormat::Int4(_) => write_q4_0_as_int4(bytes, rows, cols, out).map_err(quant_err)?,
        WeightFormat::Padded(_) => {
            out.fill(0);
            let PaddedBlock { bytes: size, split } = PaddedBlock::of_padded(t);
            for (padded, block) in out.chunks_exact_mut(size).zip(bytes.chunks_exact(t.type_size())) {
                padded[..split].copy_from_slice(&block[..split]);
                padded[size - (block.len() - split)..].copy_from_slice(&block[split..]);
            }
        }
        _ => {
            out[..bytes.len()].copy_from_slice(bytes);
            out[bytes.len()..].fill(0);
        }
    }
    Ok(())
}

/// Index of the reader define of type `t`'s padded blocks in [`crate::gpu::shader::GGML_DEFINES`].
fn padded_reader(t: GgmlType) -> usize {
    match t {
        GgmlType::Q6K => 9,
        GgmlType::Q8_0 => 10,
        GgmlType::Mxfp4 => 11,
        t => unreachable!("{} has no padded blocks", t.name()),
    }
}

/// Index of type `t`'s reader define in [`crate::gpu::shader::GGML_DEFINES`].
fn ggml_reader(t: GgmlType) -> usize {
    match t {
        GgmlType::Q4_0 => 0,
        GgmlType::Q8_0 => 1,
        GgmlType::Q4K => 2,
        GgmlType::Q5K => 3,
        GgmlType::Q6K => 4,
        GgmlType::Mxfp4 => 5,
        GgmlType::BF16 => 6,
        GgmlType::Q5_0 => 7,
        GgmlType::Q5_1 => 8,
        GgmlType::F32 | GgmlType::F16 => unreachable!("F32 and F16 GGUF tensors use the plain formats"),
    }
}

/// One row range of a matrix in its own buffer.
pub struct MatrixChunk {
    /// The buffer holding rows `first_row .. first_row + rows` as one blob.
    pub buffer: wgpu::Buffer,
    /// First row held.
    pub first_row: usize,
    /// Rows held.
    pub rows: usize,
    /// Segment offsets inside the blob.
    pub offsets: BlobOffsets,
}

/// A row-major `[rows, cols]` weight matrix on the GPU.
pub struct GpuMatrix {
    /// Rows (output features).
    pub rows: usize,
    /// Columns (input features); a multiple of 8.
    pub cols: usize,
    /// Storage format.
    pub format: WeightFormat,
    /// Stored in the CPU layout's tiles ([`super::weight_tiles`]), not row-major.
    pub tiles: bool,
    /// Row chunks, each within the device's binding limit.
    pub chunks: Vec<MatrixChunk>,
}

impl GpuMatrix {
    /// The shader defines selecting this matrix's weight reader: its format's, and `TILES`
    /// for tiles.
    pub fn defines(&self) -> Vec<&'static str> {
        weight_tiles::reader_defines(self.format, self.tiles)
    }

    /// Uploads the 2-D tensor `t` in `format`, chunked by the binding limit. An int4 tensor
    /// already in `format` (from a converted model) is uploaded as stored.
    pub fn upload(gpu: &Gpu, label: &str, t: &HostTensor, format: WeightFormat) -> Result<Self> {
        let (rows, cols, data) = match t.shape[..] {
            [r, c] => (r, c, &t.data),
            _ => return Err(Error::InvalidArgument(format!("{label}: shape {:?} is not a matrix", t.shape))),
        };
        if let Some(m) = t.int4.as_ref().filter(|m| WeightFormat::Int4(m.params) == format) {
            return GpuMatrix::upload_int4(gpu, label, m);
        }
        GpuMatrix::upload_with(gpu, label, rows, cols, format, |first_row, n| {
            format
                .encode(&data[first_row * cols..(first_row + n) * cols], n, cols)
                .map_err(|e| naming(&format!("{label} (rows from {first_row})"), e))
        })
    }

    /// Uploads an int4 matrix as it is.
    fn upload_int4(gpu: &Gpu, label: &str, m: &Int4Matrix) -> Result<Self> {
        let format = WeightFormat::Int4(m.params);
        GpuMatrix::upload_with(gpu, label, m.rows, m.cols, format, |first_row, n| {
            let mut blob = vec![0u8; format.blob_bytes(n, m.cols)?];
            m.rows(first_row..first_row + n).write_into(&mut blob).map_err(quant_err)?;
            Ok(blob)
        })
    }

    /// Uploads a `[rows, cols]` matrix of ggml type `t` from its GGUF bytes, unchanged.
    pub fn upload_ggml(gpu: &Gpu, label: &str, rows: usize, cols: usize, t: GgmlType, bytes: &[u8]) -> Result<Self> {
        let format = WeightFormat::of_ggml(t);
        let row_bytes = ggml_row_bytes(label, rows, cols, t, bytes)?;
        GpuMatrix::upload_with(gpu, label, rows, cols, format, |first_row, n| {
            let mut blob = vec![0u8; format.blob_bytes(n, cols)?];
            blob[..n * row_bytes].copy_from_slice(&bytes[first_row * row_bytes..(first_row + n) * row_bytes]);
            Ok(blob)
        })
    }

    /// Uploads a `[rows, cols]` matrix of ggml type `t` from its GGUF bytes in the format the
    /// kernels read best, [`WeightFormat::for_gpu`] (Q4_0 as int4, Q6_K padded, the other types
    /// as stored), every weight the same value.
    pub fn upload_gguf(gpu: &Gpu, label: &str, rows: usize, cols: usize, t: GgmlType, bytes: &[u8]) -> Result<Self> {
        let row_bytes = ggml_row_bytes(label, rows, cols, t, bytes)?;
        let format = WeightFormat::of_ggml(t).for_gpu();
        GpuMatrix::upload_with(gpu, label, rows, cols, format, |first_row, n| {
            let mut blob = vec![0u8; format.blob_bytes(n, cols)?];
            let rows_bytes = &bytes[first_row * row_bytes..(first_row + n) * row_bytes];
            write_gguf_blob(t, n, cols, rows_bytes, &mut blob).map_err(|e| naming(label, e))?;
            Ok(blob)
        })
    }

    /// Splits the rows into chunks whose blobs fit one binding and uploads `blob(first_row, n)`
    /// for each, tiled where [`weight_tiles::apply`] says (chunks of whole tiles).
    fn upload_with(
        gpu: &Gpu,
        label: &str,
        rows: usize,
        cols: usize,
        format: WeightFormat,
        blob: impl Fn(usize, usize) -> Result<Vec<u8>>,
    ) -> Result<Self> {
        if !cols.is_multiple_of(8) {
            return Err(Error::UnsupportedConfig(format!("{label}: {cols} columns is not a multiple of 8")));
        }
        // Every chunk's blob (segments padded to 256 bytes) must fit one binding.
        let row_bytes = format.blob_bytes(1, cols)? as u64;
        let mut rows_per_chunk = (gpu.caps.max_binding / row_bytes.max(1)) as usize;
        while rows_per_chunk > 0 && format.blob_bytes(rows_per_chunk.min(rows), cols)? as u64 > gpu.caps.max_binding {
            rows_per_chunk -= rows_per_chunk.div_ceil(16);
        }
        // Tiles where a chunk holds at least one whole tile.
        let tiles = weight_tiles::apply(gpu, format, rows, cols) && rows_per_chunk >= weight_tiles::TILE;
        if tiles {
            rows_per_chunk -= rows_per_chunk % weight_tiles::TILE;
        }
        if rows_per_chunk == 0 {
            return Err(Error::Gpu(format!(
                "{label}: one row ({row_bytes} bytes) exceeds the storage binding limit ({})",
                gpu.caps.max_binding
            )));
        }
        let mut chunks = Vec::new();
        let mut first_row = 0;
        while first_row < rows {
            let n = rows_per_chunk.min(rows - first_row);
            let offsets = format.offsets(n, cols)?;
            let mut bytes = blob(first_row, n)?;
            if tiles {
                weight_tiles::tile(&mut bytes, n, cols, format, offsets, &mut Vec::new())?;
            }
            chunks.push(MatrixChunk { buffer: gpu.upload(label, &bytes), first_row, rows: n, offsets });
            first_row += n;
        }
        Ok(GpuMatrix { rows, cols, format, tiles, chunks })
    }
}

impl WeightFormat {
    /// The values the GPU sees for a `[rows, cols]` matrix stored in this format (encode then
    /// decode), so a CPU reference can run on exactly the same weights.
    pub fn round_trip(self, values: &[f32], rows: usize, cols: usize) -> Result<Vec<f32>> {
        Ok(match self {
            WeightFormat::F32 => values.to_vec(),
            WeightFormat::F16 => values.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect(),
            WeightFormat::Int4(p) => crate::quant::quantize(values, rows, cols, p).map_err(quant_err)?.dequantize(),
            WeightFormat::Ggml(t) => return Err(not_a_quantizer(t)),
            WeightFormat::Padded(t) => return Err(not_a_quantizer(t)),
        })
    }
}
