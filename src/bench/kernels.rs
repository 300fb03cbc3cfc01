//! Kernel bandwidth: the decode matvec (T = 1 matmul) in int4, f16 and f32 and decode attention
//! ([`super::attention_bandwidth`]), against a plain buffer-to-buffer copy and a compute read on
//! the same adapter.
//!
//! Each measurement records many dispatches (or copies) into one submission after a warm-up
//! and times the submission on the wall clock, syncing with [`Gpu::wait`]; the figure is the
//! median of three such submissions. Dispatches rotate over enough replicas of the matrix that
//! the working set is at least [`KernelBenchOptions::working_set`] bytes, so large GPU caches
//! do not serve the weights. Bytes counted per dispatch:
//! * int4: the weight blob (packed codes + f16 scales + f16 mins, without padding),
//! * f16: `rows * cols * 2`, f32: `rows * cols * 4` (the input vector and output are ignored),
//! * copy: the bytes *read* (a buffer of `rows * cols * 2` bytes); memory traffic is twice that,
//! * read: a compute kernel summing a buffer of `rows * cols * 2` bytes (the read roofline; on
//!   some drivers `copy_buffer_to_buffer` runs far below memory bandwidth, so the matvecs are
//!   also compared with this): in 16-byte loads as `vec4<f32>`s, and where the device has
//!   8-byte integers as `vec2<u64>`s too (lavapipe loads each component in a per-lane loop,
//!   so those read faster there); the roofline is the faster of the two.

use std::time::Instant;

use half::f16;
use serde::Serialize;

use super::attention_bandwidth::{self, AttentionBandwidth, BENCH_HEADS};
use super::timing::median;
use crate::error::Result;
use crate::gpu::{Gpu, Pass, StepUniform};
use crate::model::HostTensor;
use crate::ops::attention::Heads;
use crate::ops::matmul::{MatMul, MatMulOut};
use crate::ops::matrix::MatrixChunk;
use crate::ops::{GpuMatrix, KvDtype, WeightFormat};
use crate::quant::{Int4Layout, Int4Matrix, QuantParams};
use crate::util::rng::SplitMix64;

/// What to measure.
#[derive(Clone, Copy, Debug)]
pub struct KernelBenchOptions {
    /// Matrix rows (output features).
    pub rows: usize,
    /// Matrix columns (input features); a multiple of 64.
    pub cols: usize,
    /// Wall-clock seconds of timed submissions per kernel (split over three submissions).
    pub seconds: f64,
    /// Least bytes each kernel's dispatches cycle through (replicas of the matrix).
    pub working_set: u64,
    /// Cached positions of the decode-attention measurement.
    pub kv_len: usize,
    /// Head layout of the decode-attention measurement.
    pub attention_heads: Heads,
}

impl Default for KernelBenchOptions {
    /// 4096 × 4096, 1.5 s per kernel, 256 MiB working set, attention of [`BENCH_HEADS`] over
    /// 16384 positions.
    fn default() -> Self {
        KernelBenchOptions {
            rows: 4096,
            cols: 4096,
            seconds: 1.5,
            working_set: 256 << 20,
            kv_len: 16384,
            attention_heads: BENCH_HEADS,
        }
    }
}

/// Bandwidth figures of one adapter (GB/s are 10^9 bytes per second).
#[derive(Clone, Debug, Serialize)]
pub struct KernelReport {
    /// Adapter name.
    pub adapter: String,
    /// Vulkan, Metal, Dx12, ...
    pub backend: String,
    /// Matrix rows.
    pub rows: usize,
    /// Matrix columns.
    pub cols: usize,
    /// int4 matvec, weight-blob bytes per second.
    pub int4_gbps: f64,
    /// f16 matvec, weight bytes per second.
    pub f16_gbps: f64,
    /// f32 matvec, weight bytes per second.
    pub f32_gbps: f64,
    /// Buffer copy, bytes read per second.
    pub copy_gbps: f64,
    /// Compute-shader read of a buffer, bytes read per second: the faster of
    /// [`Self::read_vec4_gbps`] and [`Self::read_u64_gbps`].
    pub read_gbps: f64,
    /// The read in `vec4<f32>` loads.
    pub read_vec4_gbps: f64,
    /// The read in `vec2<u64>` loads, where the device has `SHADER_INT64`.
    pub read_u64_gbps: Option<f64>,
    /// `int4_gbps / copy_gbps`.
    pub int4_vs_copy: f64,
    /// `f16_gbps / copy_gbps`.
    pub f16_vs_copy: f64,
    /// `int4_gbps / read_gbps`.
    pub int4_vs_read: f64,
    /// `f16_gbps / read_gbps`.
    pub f16_vs_read: f64,
    /// Weights per second of the int4 matvec over those of the f16 matvec.
    pub int4_vs_f16: f64,
    /// Microseconds per int4 matvec.
    pub int4_us: f64,
    /// Microseconds per f16 matvec.
    pub f16_us: f64,
    /// Microseconds per f32 matvec.
    pub f32_us: f64,
    /// Microseconds per copy.
    pub copy_us: f64,
    /// Microseconds per read.
    pub read_us: f64,
    /// Bytes counted per int4 matvec.
    pub int4_bytes: u64,
    /// Decode attention over `kv_len` positions of an f16 cache.
    pub attention: AttentionBandwidth,
    /// `attention.gbps / read_gbps`: 1 when decode attention costs what its cache bytes cost.
    pub attention_vs_read: f64,
    /// The same over a q8_0 cache (about half the bytes).
    pub attention_q8_0: AttentionBandwidth,
    /// Microseconds of decode attention over the q8_0 cache per microsecond over the f16 one.
    pub attention_q8_0_vs_f16_time: f64,
}

/// Seconds per operation and bytes per operation of one kernel.
struct Measured {
    seconds: f64,
    bytes: u64,
}

impl Measured {
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }
}

/// Measures the three matvecs, decode attention, the copy and the read on `gpu`.
pub fn run(gpu: &Gpu, o: &KernelBenchOptions) -> Result<KernelReport> {
    let (rows, cols) = (o.rows, o.cols);
    if rows == 0 || cols == 0 || cols % 64 != 0 {
        return Err(crate::Error::InvalidArgument(format!(
            "bench kernels needs rows > 0 and cols a positive multiple of 64, got {rows} x {cols}"
        )));
    }
    let mut rng = SplitMix64::new(1);
    let params = QuantParams::default();
    let int4_bytes = int4_weight_bytes(rows, cols, params)?;
    let m = random_int4(rows, cols, params, &mut rng);
    let host = HostTensor { shape: vec![rows, cols], data: m.dequantize(), int4: Some(m), ggml: None };
    let int4 = matvec(gpu, o, host, WeightFormat::Int4(params), int4_bytes)?;
    let dense = HostTensor::new(vec![rows, cols], (0..rows * cols).map(|_| rng.next_signed() * 0.05).collect());
    let f16 = matvec(gpu, o, dense.clone(), WeightFormat::F16, (rows * cols * 2) as u64)?;
    let f32 = matvec(gpu, o, dense, WeightFormat::F32, (rows * cols * 4) as u64)?;
    let copy = copy(gpu, o, (rows * cols * 2) as u64)?;
    let read_vec4 = read(gpu, o, (rows * cols * 2) as u64, ReadLoads::Vec4F32)?;
    let read_u64 = match gpu.device.features().contains(wgpu::Features::SHADER_INT64) {
        true => Some(read(gpu, o, (rows * cols * 2) as u64, ReadLoads::Vec2U64)?),
        false => None,
    };
    let read = match &read_u64 {
        Some(u64s) if u64s.seconds < read_vec4.seconds => u64s,
        _ => &read_vec4,
    };
    let attention = attention_bandwidth::measure(gpu, o, o.kv_len, KvDtype::F16)?;
    let attention_q8_0 = attention_bandwidth::measure(gpu, o, o.kv_len, KvDtype::Q8_0)?;
    Ok(KernelReport {
        adapter: gpu.adapter.name.clone(),
        backend: gpu.adapter.backend.clone(),
        rows,
        cols,
        int4_gbps: int4.gbps(),
        f16_gbps: f16.gbps(),
        f32_gbps: f32.gbps(),
        copy_gbps: copy.gbps(),
        int4_vs_copy: int4.gbps() / copy.gbps(),
        f16_vs_copy: f16.gbps() / copy.gbps(),
        read_gbps: read.gbps(),
        read_vec4_gbps: read_vec4.gbps(),
        read_u64_gbps: read_u64.as_ref().map(Measured::gbps),
        int4_vs_read: int4.gbps() / read.gbps(),
        f16_vs_read: f16.gbps() / read.gbps(),
        int4_vs_f16: f16.seconds / int4.seconds,
        int4_us: int4.seconds * 1e6,
        f16_us: f16.seconds * 1e6,
        f32_us: f32.seconds * 1e6,
        copy_us: copy.seconds * 1e6,
        read_us: read.seconds * 1e6,
        int4_bytes,
        attention_vs_read: attention.gbps / read.gbps(),
        attention_q8_0_vs_f16_time: attention_q8_0.us / attention.us,
        attention,
        attention_q8_0,
    })
}

/// A `[rows, cols]` int4 matrix with random codes and plausible scales and mins (the matvec's
/// speed does not depend on the values, and this skips quantizing millions of weights).
fn random_int4(rows: usize, cols: usize, params: QuantParams, rng: &mut SplitMix64) -> Int4Matrix {
    let groups = rows * params.groups_per_row(cols);
    let scales: Vec<f32> = (0..groups).map(|_| 0.004 + 0.002 * rng.next_signed()).collect();
    let mins = if params.scheme.has_mins() { scales.iter().map(|s| f16::from_f32(-7.5 * s)).collect() } else { vec![] };
    let scales = scales.into_iter().map(f16::from_f32).collect();
    let packed = (0..rows * cols / 8).map(|_| rng.next_u64() as u32).collect();
    Int4Matrix { rows, cols, params, packed, scales, mins }
}

/// Bytes of an int4 blob's segments without their padding.
fn int4_weight_bytes(rows: usize, cols: usize, params: QuantParams) -> Result<u64> {
    let l = Int4Layout::new(rows, cols, params).map_err(|e| crate::Error::UnsupportedConfig(e.to_string()))?;
    Ok((l.packed_len + l.scales_len + l.mins_len) as u64)
}

/// Replicas needed for a working set of at least `o.working_set` bytes (at most 64).
pub(super) fn replicas(o: &KernelBenchOptions, bytes: u64) -> usize {
    o.working_set.div_ceil(bytes.max(1)).clamp(1, 64) as usize
}

/// A GPU-side copy of `m` (same chunks, new buffers).
fn replicate(gpu: &Gpu, encoder: &mut wgpu::CommandEncoder, m: &GpuMatrix) -> GpuMatrix {
    let chunks = m
        .chunks
        .iter()
        .map(|c| {
            let buffer = gpu.storage("bench matrix replica", c.buffer.size());
            encoder.copy_buffer_to_buffer(&c.buffer, 0, &buffer, 0, c.buffer.size());
            MatrixChunk { buffer, first_row: c.first_row, rows: c.rows, offsets: c.offsets }
        })
        .collect();
    GpuMatrix { rows: m.rows, cols: m.cols, format: m.format, tiles: m.tiles, chunks }
}

/// Times submissions of `record(encoder, n)` (which records `n` operations): a warm-up of
/// `warmup` operations, which also calibrates `n`, then three timed submissions taking about
/// `seconds` in all; returns the median seconds per operation.
pub(super) fn time_ops(gpu: &Gpu, seconds: f64, warmup: usize, record: impl Fn(&mut Pass, usize)) -> Result<f64> {
    let submit = |n: usize| -> Result<f64> {
        let mut pass = Pass::new(&gpu.device);
        record(&mut pass, n);
        let start = Instant::now();
        pass.submit(&gpu.queue);
        gpu.wait()?;
        Ok(start.elapsed().as_secs_f64())
    };
    let per_op = submit(warmup)? / warmup as f64;
    let n = ((seconds / 3.0 / per_op.max(1e-9)) as usize).clamp(1, 20_000);
    let times = (0..3).map(|_| submit(n).map(|s| s / n as f64)).collect::<Result<Vec<f64>>>()?;
    Ok(median(&times))
}

/// Times the T = 1 matmul of `host` stored as `format`, counting `bytes` per dispatch.
fn matvec(gpu: &Gpu, o: &KernelBenchOptions, host: HostTensor, format: WeightFormat, bytes: u64) -> Result<Measured> {
    let (rows, cols) = (o.rows, o.cols);
    let first = GpuMatrix::upload(gpu, "bench matrix", &host, format)?;
    drop(host);
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    let mut mats = vec![];
    for _ in 1..replicas(o, bytes) {
        mats.push(replicate(gpu, &mut encoder, &first));
    }
    gpu.queue.submit([encoder.finish()]);
    mats.push(first);
    let step = StepUniform::new(gpu);
    step.set(gpu, 1, 0);
    let mut rng = SplitMix64::new(2);
    let x: Vec<f32> = (0..cols).map(|_| rng.next_signed()).collect();
    let x = gpu.upload("bench x", bytemuck::cast_slice(&x));
    let y = gpu.storage("bench y", (rows * 4) as u64);
    let kernels: Vec<MatMul> =
        mats.iter().map(|m| MatMul::new(gpu, &step.buffer, &x, m, None, &y, MatMulOut::plain(rows))).collect();
    let seconds = time_ops(gpu, o.seconds, kernels.len(), |pass, n| {
        for i in 0..n {
            kernels[i % kernels.len()].record(gpu, pass, 1);
        }
    })?;
    Ok(Measured { seconds, bytes })
}

/// Times `copy_buffer_to_buffer` of `bytes`, counting the bytes read.
fn copy(gpu: &Gpu, o: &KernelBenchOptions, bytes: u64) -> Result<Measured> {
    let bytes = bytes.next_multiple_of(16);
    let pairs: Vec<(wgpu::Buffer, wgpu::Buffer)> = (0..replicas(o, bytes))
        .map(|_| (gpu.storage("bench copy src", bytes), gpu.storage("bench copy dst", bytes)))
        .collect();
    let seconds = time_ops(gpu, o.seconds, pairs.len(), |pass, n| {
        let encoder = pass.encoder();
        for i in 0..n {
            let (src, dst) = &pairs[i % pairs.len()];
            encoder.copy_buffer_to_buffer(src, 0, dst, 0, bytes);
        }
    })?;
    Ok(Measured { seconds, bytes })
}

/// The loads the read kernel makes, 16 bytes each.
#[derive(Clone, Copy)]
enum ReadLoads {
    Vec4F32,
    Vec2U64,
}

impl ReadLoads {
    /// Sums a storage buffer in these loads, grid-stride, one partial sum per thread.
    fn wgsl(self) -> String {
        let (element, zero, fold) = match self {
            Self::Vec4F32 => ("vec4<f32>", "vec4<f32>(0.0)", "acc.x + acc.y + acc.z + acc.w"),
            Self::Vec2U64 => ("vec2<u64>", "vec2<u64>(0lu)", "f32(u32(acc.x ^ acc.y))"),
        };
        format!(
            "
@group(0) @binding(0) var<storage, read> src: array<{element}>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{
    var acc = {zero};
    for (var i = gid.x; i < arrayLength(&src); i += nwg.x * 256u) {{
        acc += src[i];
    }}
    dst[gid.x] = {fold};
}}
"
        )
    }
}

/// Workgroups of the read kernel (256 threads each).
const READ_GROUPS: u32 = 1024;

/// Times the read kernel over `bytes` (at most one binding) in `loads`, counting the bytes read.
fn read(gpu: &Gpu, o: &KernelBenchOptions, bytes: u64, loads: ReadLoads) -> Result<Measured> {
    let bytes = bytes.min(gpu.caps.max_binding).next_multiple_of(16);
    let module = gpu.shader_module("bench read", &loads.wgsl());
    let pipeline = gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("bench read"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    let dst = gpu.storage("bench read dst", READ_GROUPS as u64 * 256 * 4);
    let groups: Vec<wgpu::BindGroup> = (0..replicas(o, bytes))
        .map(|_| {
            let src = gpu.storage("bench read src", bytes);
            gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("bench read"),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry { binding: 0, resource: src.as_entire_binding() },
                    wgpu::BindGroupEntry { binding: 1, resource: dst.as_entire_binding() },
                ],
            })
        })
        .collect();
    let seconds = time_ops(gpu, o.seconds, groups.len(), |pass, n| {
        let pass = pass.compute();
        pass.set_pipeline(&pipeline);
        for i in 0..n {
            pass.set_bind_group(0, &groups[i % groups.len()], &[]);
            pass.dispatch_workgroups(READ_GROUPS, 1, 1);
        }
    })?;
    Ok(Measured { seconds, bytes })
}
