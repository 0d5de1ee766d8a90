//! Linear layers that read the same input (Q, K and V; gate and up) run as one int8 product:
//! the input is quantized once and the pool is dispatched once instead of per layer.

use std::sync::Arc;

use candle_core::Tensor;
use triage_ops::{q8_matmul, Q8Matrix};

use crate::layers::{Linear, Q8_MAX_ROWS};
use crate::Result;

/// Several `Linear`s over one input. Where every part has Q8_0 weights on CPU they are stacked
/// by rows into one matrix (the parts give theirs up, so nothing is stored twice); the outputs
/// are the stacked product's columns, split back, each with its part's bias. Each output element
/// has its own accumulator, so the results are the parts' bits.
#[derive(Debug, Clone)]
pub struct FusedLinear {
    parts: Vec<Linear>,
    /// The parts' Q8_0 weights stacked, with each part's width.
    stacked: Option<(Arc<Q8Matrix>, Vec<usize>)>,
}

impl FusedLinear {
    pub fn new(mut parts: Vec<Linear>) -> Result<Self> {
        if parts.len() < 2 || !parts.iter().all(Linear::has_q8) {
            return Ok(Self {
                parts,
                stacked: None,
            });
        }
        let q8: Vec<Arc<Q8Matrix>> = parts.iter_mut().filter_map(Linear::take_q8).collect();
        let widths = q8.iter().map(|m| m.rows()).collect();
        let refs: Vec<&Q8Matrix> = q8.iter().map(Arc::as_ref).collect();
        let stacked = Arc::new(Q8Matrix::stack_rows(&refs)?);
        Ok(Self {
            parts,
            stacked: Some((stacked, widths)),
        })
    }

    /// Output features of each part.
    pub fn out_features(&self) -> Result<Vec<usize>> {
        match &self.stacked {
            Some((_, widths)) => Ok(widths.clone()),
            None => self.parts.iter().map(Linear::out_features).collect(),
        }
    }

    /// `x`: `[rows, in]` f32 → one `[rows, out_i]` f32 per part. Multi-row products (prefill)
    /// take the parts' dense copies where they have them, as a lone `Linear` would.
    pub fn forward(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let rows = x.dim(0)?;
        let dense = rows >= Q8_MAX_ROWS && self.parts.iter().all(Linear::has_dense);
        let Some((stacked, widths)) = self.stacked.as_ref().filter(|_| !dense) else {
            return self.parts.iter().map(|p| p.forward(x)).collect();
        };
        let y = q8_matmul(x, stacked)?;
        let mut outputs = Vec::with_capacity(widths.len());
        let mut start = 0;
        for (part, &width) in self.parts.iter().zip(widths) {
            let out = y.narrow(1, start, width)?;
            outputs.push(match part.bias() {
                Some(b) => out.broadcast_add(b)?,
                None => out.contiguous()?,
            });
            start += width;
        }
        Ok(outputs)
    }
}
