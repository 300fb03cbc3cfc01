//! Buffer creation, uploads and readbacks.

use wgpu::util::DeviceExt;

use super::objects::Object;
use super::{Gpu, Pass};
use crate::error::{Error, Result};

const STORAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

impl Gpu {
    /// A zero-initialised storage buffer of `bytes` (rounded up to 16).
    pub fn storage(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        let size = bytes.max(16).next_multiple_of(16);
        self.count_allocation(size);
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: STORAGE,
            mapped_at_creation: false,
        })
    }

    /// A storage buffer initialised with `data` (padded to 16 bytes). Its staging copy counts
    /// towards the bound on staged uploads: past 16 MiB the queued ones are submitted and waited
    /// for, so that wgpu frees their staging.
    pub fn upload(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let mut padded;
        let contents = if data.len().is_multiple_of(16) && !data.is_empty() {
            data
        } else {
            padded = data.to_vec();
            padded.resize(data.len().max(16).next_multiple_of(16), 0);
            &padded
        };
        self.count_allocation(contents.len() as u64);
        let buffer = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents,
            usage: STORAGE,
        });
        self.bound_staging(contents.len() as u64);
        buffer
    }

    /// A uniform buffer holding `data` (static kernel parameters).
    pub fn uniform(&self, label: &str, data: &[u8]) -> wgpu::Buffer {
        let mut contents = data.to_vec();
        contents.resize(data.len().max(16).next_multiple_of(16), 0);
        self.objects.created(Object::Buffer);
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: &contents,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
    }

    /// Copies `count` f32 values starting at element `offset` of `src` back to the host.
    /// Convenience for tests and one-off reads; the engine uses a persistent [`Readback`].
    pub fn read_f32(&self, src: &wgpu::Buffer, offset: usize, count: usize) -> Result<Vec<f32>> {
        let rb = Readback::new(self, (count * 4) as u64);
        let mut out = vec![0f32; count];
        rb.read(self, src, (offset * 4) as u64, bytemuck::cast_slice_mut(&mut out))?;
        Ok(out)
    }
}

/// A persistent host-visible staging buffer for reading results back without allocating.
pub struct Readback {
    buffer: wgpu::Buffer,
    capacity: u64,
}

impl Readback {
    /// A staging buffer able to hold `capacity` bytes.
    pub fn new(gpu: &Gpu, capacity: u64) -> Self {
        gpu.objects.created(Object::Buffer);
        Self::on_device(&gpu.device, capacity)
    }

    /// [`Readback::new`] on a bare device (while its [`Gpu`] is being built).
    pub(crate) fn on_device(device: &wgpu::Device, capacity: u64) -> Self {
        let capacity = capacity.max(4).next_multiple_of(4);
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: capacity,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Readback { buffer, capacity }
    }

    /// Copies `out.len()` bytes from `src` at `offset` into `out`, waiting for the GPU.
    pub fn read(&self, gpu: &Gpu, src: &wgpu::Buffer, offset: u64, out: &mut [u8]) -> Result<()> {
        self.read_after(gpu, Pass::new(&gpu.device), src, offset, out)
    }

    /// [`Readback::read`] with the copy appended to `rec`, which is submitted with it: the
    /// work that computes `src` and its readback in one submission.
    pub fn read_after(&self, gpu: &Gpu, mut rec: Pass, src: &wgpu::Buffer, offset: u64, out: &mut [u8]) -> Result<()> {
        self.record_copy(rec.encoder(), src, offset, out.len() as u64)?;
        let submission = rec.submit(&gpu.queue);
        self.map(out.len() as u64).finish(gpu, Some(submission), out)
    }

    /// Records into `encoder` a copy of `len` bytes of `src` at `offset` into the staging
    /// buffer; after submitting it, [`Readback::map`] and [`PendingRead::finish`] read them.
    pub fn record_copy(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        self.record_copy_at(encoder, src, offset, len, 0)
    }

    /// [`Readback::record_copy`] into the staging buffer at byte `at` (several copies, each
    /// into its own part, read back together).
    pub fn record_copy_at(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        offset: u64,
        len: u64,
        at: u64,
    ) -> Result<()> {
        if at + len > self.capacity || !len.is_multiple_of(4) || !at.is_multiple_of(4) {
            return Err(Error::Gpu(format!(
                "readback of {len} bytes at {at} exceeds staging capacity {}",
                self.capacity
            )));
        }
        encoder.copy_buffer_to_buffer(src, offset, &self.buffer, at, len);
        Ok(())
    }

    /// Asks for the staging buffer's first `len` bytes once the submitted copy into it has run,
    /// without waiting. The buffer takes no copy until the returned read is finished.
    pub fn map(&self, len: u64) -> PendingRead<'_> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.buffer.slice(0..len).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        PendingRead { readback: self, len, mapped: rx }
    }
}

/// A staging buffer's map that has been asked for ([`Readback::map`]) and not yet read.
pub struct PendingRead<'a> {
    readback: &'a Readback,
    len: u64,
    mapped: std::sync::mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
}

impl PendingRead<'_> {
    /// Waits for `submission` (the one that copied into the staging buffer; `None`: all
    /// submitted work), copies the bytes into `out` (`len` of them) and unmaps the buffer.
    pub fn finish(self, gpu: &Gpu, submission: Option<wgpu::SubmissionIndex>, out: &mut [u8]) -> Result<()> {
        gpu.wait_for(submission)?;
        self.mapped
            .recv()
            .map_err(|_| Error::Gpu("readback callback dropped".into()))?
            .map_err(|e| Error::Gpu(format!("readback map failed: {e}")))?;
        let slice = self.readback.buffer.slice(0..self.len);
        {
            let view = slice.get_mapped_range().map_err(|e| Error::Gpu(format!("readback view failed: {e}")))?;
            out.copy_from_slice(&view);
        }
        self.readback.buffer.unmap();
        Ok(())
    }
}

/// Per-step values every kernel sees at binding 0: how many tokens this step processes and
/// where they start in the sequence.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StepValues {
    /// Tokens processed in this step (1 for decode).
    pub n_tokens: u32,
    /// Position of the first of them.
    pub pos: u32,
    /// Keys in the cache after this step (`pos + n_tokens`).
    pub kv_len: u32,
    /// Padding.
    pub pad: u32,
}

/// The uniform buffer holding [`StepValues`], written once per step.
pub struct StepUniform {
    /// The buffer bound at binding 0 of every kernel.
    pub buffer: wgpu::Buffer,
}

impl StepUniform {
    /// A new step uniform (zeroed).
    pub fn new(gpu: &Gpu) -> Self {
        StepUniform { buffer: gpu.uniform("step", bytemuck::bytes_of(&StepValues::default())) }
    }

    /// Sets the step's token count and start position (visible to work submitted afterwards).
    pub fn set(&self, gpu: &Gpu, n_tokens: usize, pos: usize) {
        let v = StepValues { n_tokens: n_tokens as u32, pos: pos as u32, kv_len: (pos + n_tokens) as u32, pad: 0 };
        gpu.queue.write_buffer(&self.buffer, 0, bytemuck::bytes_of(&v));
    }
}
