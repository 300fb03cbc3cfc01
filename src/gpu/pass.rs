//! [`Pass`]: what every kernel records into — a command encoder with an open compute pass.
//!
//! Kernels normally share one compute pass per submission. The profiler's fallback timings
//! need more than a pass offers: per-pass timestamps (adapters without timestamps inside
//! passes, e.g. Apple GPUs on Metal) end the pass and open one per dispatch, and per-dispatch
//! submits (adapters without timestamps) submit and wait around a dispatch. A `Pass` owns the
//! encoder so both can happen in the middle of a recording.

/// A command encoder with an open compute pass (opened on first use).
pub struct Pass {
    device: wgpu::Device,
    encoder: wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
}

impl Pass {
    /// A new encoder on `device`.
    pub fn new(device: &wgpu::Device) -> Pass {
        Pass { device: device.clone(), encoder: device.create_command_encoder(&Default::default()), pass: None }
    }

    /// The open compute pass (set a pipeline and bind group, then dispatch), opened if none is.
    pub fn compute(&mut self) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            self.open(None);
        }
        self.pass.as_mut().expect("a compute pass was just opened")
    }

    /// The encoder, for commands outside compute passes (buffer copies): the open compute pass
    /// ends, and the next [`Pass::compute`] opens another.
    pub fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.end();
        &mut self.encoder
    }

    /// Ends the open compute pass and opens one that writes `timestamps` at its boundaries.
    pub(crate) fn open_timed(&mut self, timestamps: wgpu::ComputePassTimestampWrites<'_>) {
        self.end();
        self.open(Some(timestamps));
    }

    /// Ends the open compute pass (the next [`Pass::compute`] opens another).
    pub(crate) fn end(&mut self) {
        drop(self.pass.take());
    }

    /// Submits everything recorded so far to `queue`, continuing in a fresh encoder.
    pub(crate) fn flush(&mut self, queue: &wgpu::Queue) {
        self.end();
        let fresh = self.device.create_command_encoder(&Default::default());
        queue.submit([std::mem::replace(&mut self.encoder, fresh).finish()]);
    }

    /// Ends the pass and submits the recording to `queue`.
    pub fn submit(mut self, queue: &wgpu::Queue) -> wgpu::SubmissionIndex {
        self.end();
        queue.submit([self.encoder.finish()])
    }

    fn open(&mut self, timestamps: Option<wgpu::ComputePassTimestampWrites<'_>>) {
        let descriptor = wgpu::ComputePassDescriptor { label: None, timestamp_writes: timestamps };
        self.pass = Some(self.encoder.begin_compute_pass(&descriptor).forget_lifetime());
    }
}
