//! Weight matrices on the GPU, split by rows into chunks that each fit one storage binding.

use half::f16;

use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// How weights are stored on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightFormat {
    /// 32-bit floats (exact comparison with the CPU reference).
    F32,
    /// IEEE halves packed two per 32-bit word.
    F16,
}

impl WeightFormat {
    /// Bytes per weight.
    pub fn bytes(self) -> usize {
        match self {
            WeightFormat::F32 => 4,
            WeightFormat::F16 => 2,
        }
    }

    /// The shader define selecting this format's weight reader.
    pub fn define(self) -> Option<&'static str> {
        match self {
            WeightFormat::F32 => None,
            WeightFormat::F16 => Some("F16"),
        }
    }

    /// Encodes `values` in this format.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            WeightFormat::F32 => bytemuck::cast_slice(values).to_vec(),
            WeightFormat::F16 => values
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
        }
    }
}

/// One row range of a matrix in its own buffer.
pub struct MatrixChunk {
    /// The buffer holding rows `first_row .. first_row + rows`.
    pub buffer: wgpu::Buffer,
    /// First row held.
    pub first_row: usize,
    /// Rows held.
    pub rows: usize,
}

/// A row-major `[rows, cols]` weight matrix on the GPU.
pub struct GpuMatrix {
    /// Rows (output features).
    pub rows: usize,
    /// Columns (input features); a multiple of 8.
    pub cols: usize,
    /// Storage format.
    pub format: WeightFormat,
    /// Row chunks, each within the device's binding limit.
    pub chunks: Vec<MatrixChunk>,
}

impl GpuMatrix {
    /// Uploads `data` (`rows * cols` values) in `format`, chunked by the binding limit.
    pub fn upload(
        gpu: &Gpu,
        label: &str,
        data: &[f32],
        rows: usize,
        cols: usize,
        format: WeightFormat,
    ) -> Result<Self> {
        if cols % 8 != 0 {
            return Err(Error::UnsupportedConfig(format!(
                "{label}: {cols} columns is not a multiple of 8"
            )));
        }
        assert_eq!(data.len(), rows * cols, "{label}: data length");
        let row_bytes = (cols * format.bytes()) as u64;
        let rows_per_chunk = (gpu.caps.max_binding / row_bytes) as usize;
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
            let bytes = format.encode(&data[first_row * cols..(first_row + n) * cols]);
            chunks.push(MatrixChunk {
                buffer: gpu.upload(label, &bytes),
                first_row,
                rows: n,
            });
            first_row += n;
        }
        Ok(GpuMatrix {
            rows,
            cols,
            format,
            chunks,
        })
    }
}
