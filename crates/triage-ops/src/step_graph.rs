//! Decode steps replayed from a capture: a [`StepBuffer`] holds a step's inputs in one fixed
//! device buffer written by one upload before each replay, and a [`StepGraph`] is the captured
//! work. On a GPU that is a CUDA graph; on the CPU it is the recorded closure, which keeps a
//! graph's rule that launches and their arguments are frozen at capture and only the contents of
//! memory change between replays, so the CPU tests exercise what a replay on a GPU relies on.
//!
//! The hazard this guards against: candle serves small uploads made during a capture from a
//! cache keyed by their *content* (`enable_cuda_graph_htod_cache`, candle-core 0.11.1
//! `src/cuda_backend/device.rs`), so a step's token ids uploaded inside the capture would be baked
//! into the graph and every replay would read the capture's tokens. Inside a capture,
//! [`upload_u32`] refuses per-step data: the inputs must come from a `StepBuffer`.
//!
//! Graphs are off by default (`EngineConfig::cuda_graphs`) until a GPU run shows graphed tokens
//! equal eager ones; none has run yet (benches/RESULTS.md).

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(not(feature = "cuda"))]
use crate::cuda::step_graph as cuda;

use std::cell::Cell;
use std::fmt;

use candle_core::{CpuStorage, Device, InplaceOp1, Layout, Tensor};

use crate::{OpsError, Result};

thread_local! {
    /// Set while this thread records a [`StepGraph`].
    static CAPTURING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is recording a step graph now.
pub fn capturing() -> bool {
    CAPTURING.with(Cell::get)
}

/// Marks the thread as capturing until dropped (also when the captured step fails).
struct CaptureGuard;

impl CaptureGuard {
    fn new() -> Result<Self> {
        if capturing() {
            return Err(OpsError::InvalidArgument(
                "a step graph captured inside another capture".into(),
            ));
        }
        CAPTURING.with(|c| c.set(true));
        Ok(Self)
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CAPTURING.with(|c| c.set(false));
    }
}

/// Per-step `u32` data as a new tensor on `device` (token ids, positions, slots, block tables),
/// or an error while a step graph is being captured: a replay would read the captured values.
pub fn upload_u32(data: &[u32], device: &Device, what: &str) -> Result<Tensor> {
    if capturing() {
        return Err(OpsError::InvalidArgument(format!(
            "{what} uploaded while capturing a step graph: a replay would read this step's values; \
             captured steps read their inputs from a StepBuffer"
        )));
    }
    Ok(Tensor::new(data, device)?)
}

/// A step's inputs in one persistent `u32` device buffer: written by one upload before each
/// replay (from pinned host memory on a GPU), read through views whose addresses never change.
pub struct StepBuffer {
    tensor: Tensor,
    staging: cuda::HostStaging,
}

impl fmt::Debug for StepBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepBuffer")
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl StepBuffer {
    /// A buffer of `capacity` `u32`s on `device`, zeroed.
    pub fn new(capacity: usize, device: &Device) -> Result<Self> {
        Ok(Self {
            tensor: Tensor::zeros(capacity, candle_core::DType::U32, device)?,
            staging: cuda::HostStaging::new(capacity, device)?,
        })
    }

    pub fn capacity(&self) -> usize {
        self.tensor.elem_count()
    }

    /// `len` elements from `offset`, sharing the buffer's memory (what a capture reads).
    pub fn view(&self, offset: usize, len: usize) -> Result<Tensor> {
        if offset + len > self.capacity() {
            return Err(OpsError::InvalidArgument(format!(
                "a view of {offset}+{len} in a step buffer of {}",
                self.capacity()
            )));
        }
        Ok(self.tensor.narrow(0, offset, len)?)
    }

    /// Overwrite the buffer's first `data.len()` elements, in one upload. Not while capturing:
    /// writes happen before a replay, never inside one.
    pub fn write(&mut self, data: &[u32]) -> Result<()> {
        if data.len() > self.capacity() {
            return Err(OpsError::InvalidArgument(format!(
                "{} values for a step buffer of {}",
                data.len(),
                self.capacity()
            )));
        }
        if capturing() {
            return Err(OpsError::InvalidArgument(
                "a step buffer written while capturing a step graph".into(),
            ));
        }
        if self.tensor.device().is_cuda() {
            return self.staging.upload(data, &self.tensor);
        }
        Ok(self.tensor.inplace_op1(&WriteHost { data })?)
    }
}

/// Copies host values into the head of a CPU `u32` tensor, in place.
struct WriteHost<'a> {
    data: &'a [u32],
}

impl InplaceOp1 for WriteHost<'_> {
    fn name(&self) -> &'static str {
        "step-buffer-write"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let CpuStorage::U32(values) = storage else {
            candle_core::bail!("step buffer: u32 storage expected")
        };
        let start = layout.start_offset();
        let dst = values
            .get_mut(start..start + self.data.len())
            .ok_or_else(|| candle_core::Error::msg("step buffer: write past the storage"))?;
        dst.copy_from_slice(self.data);
        Ok(())
    }
}

/// The work of one step, replayable.
type Step = Box<dyn Fn() -> Result<()> + Send>;

/// One captured step. On a GPU a CUDA graph (the closure is kept only for what it holds alive:
/// the graph reads those buffers by address); on the CPU the closure itself, run again.
pub struct StepGraph {
    step: Step,
    graph: Option<cuda::CapturedGraph>,
}

impl fmt::Debug for StepGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StepGraph")
            .field("cuda", &self.graph.is_some())
            .finish()
    }
}

impl StepGraph {
    /// Capture `step` on `device`. The step must read its per-step inputs from `StepBuffer`
    /// views and leave its results in tensors made before the capture; it runs once eagerly
    /// first (on a GPU that fills candle's parameter-upload cache and loads every kernel), so
    /// its writes must be the same each time it runs on the same inputs.
    pub fn capture(
        device: &Device,
        step: impl Fn() -> Result<()> + Send + 'static,
    ) -> Result<Self> {
        let step: Step = Box::new(step);
        let graph = if device.is_cuda() {
            Some(cuda::CapturedGraph::capture(device, || {
                let _guard = CaptureGuard::new()?;
                step()
            })?)
        } else {
            let _guard = CaptureGuard::new()?;
            step()?;
            None
        };
        Ok(Self { step, graph })
    }

    /// Run the captured work again over the buffers' current contents.
    pub fn replay(&self) -> Result<()> {
        match &self.graph {
            Some(g) => g.replay(),
            None => (self.step)(),
        }
    }

    /// Kernel and copy nodes in the CUDA graph (the launches a replay makes); `None` on the CPU.
    pub fn num_nodes(&self) -> Result<Option<usize>> {
        self.graph.as_ref().map(|g| g.num_nodes()).transpose()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_replay_reads_what_the_buffer_holds_now() {
        let dev = Device::Cpu;
        let mut buffer = StepBuffer::new(4, &dev).unwrap();
        buffer.write(&[1, 2, 3, 4]).unwrap();
        let input = buffer.view(1, 2).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let out = Arc::clone(&seen);
        let graph = StepGraph::capture(&dev, move || {
            out.lock().unwrap().push(input.to_vec1::<u32>()?);
            Ok(())
        })
        .unwrap();
        buffer.write(&[9, 8, 7]).unwrap();
        graph.replay().unwrap();
        assert_eq!(*seen.lock().unwrap(), [vec![2, 3], vec![8, 7]]);
        assert!(graph.num_nodes().unwrap().is_none());
    }

    #[test]
    fn per_step_uploads_and_writes_are_refused_inside_a_capture() {
        let dev = Device::Cpu;
        let ids = [5u32, 6];
        let err = StepGraph::capture(&dev, move || {
            upload_u32(&ids, &Device::Cpu, "token ids")?;
            Ok(())
        })
        .unwrap_err();
        assert!(err
            .to_string()
            .contains("token ids uploaded while capturing"));
        // The guard is gone after a failed capture.
        assert!(!capturing());
        assert_eq!(
            upload_u32(&ids, &dev, "ids")
                .unwrap()
                .to_vec1::<u32>()
                .unwrap(),
            ids
        );
        let buffer = Arc::new(Mutex::new(StepBuffer::new(2, &dev).unwrap()));
        let inner = Arc::clone(&buffer);
        let err = StepGraph::capture(&dev, move || inner.lock().unwrap().write(&[1])).unwrap_err();
        assert!(err.to_string().contains("written while capturing"));
    }

    #[test]
    fn writes_past_the_buffer_are_refused() {
        let mut buffer = StepBuffer::new(2, &Device::Cpu).unwrap();
        assert!(buffer.write(&[1, 2, 3]).is_err());
        assert!(buffer.view(1, 2).is_err());
        buffer.write(&[7]).unwrap();
        assert_eq!(buffer.view(0, 2).unwrap().to_vec1::<u32>().unwrap(), [7, 0]);
    }
}
