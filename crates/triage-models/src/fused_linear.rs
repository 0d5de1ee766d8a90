//! Linear layers that read the same input (Q, K and V; gate and up) run as one product: on the
//! CPU one int8 product (the input is quantized once and the pool is dispatched once instead of
//! per layer); bf16 or f16 matrices (the GPU's layout) as one GEMM over the stacked matrix.

use std::sync::Arc;

use candle_core::{DType, Tensor};
use triage_ops::{kquant_matmul, q8_matmul, KQuantMatrix, Q8Matrix};

use crate::layers::{Linear, Q8_MAX_ROWS};
use crate::weights::PackedMatrix;
use crate::Result;

/// Several `Linear`s over one input. Where every part has Q8_0 weights on CPU, or K-quant
/// weights of one type that stack (`KQuantMatrix::stack_rows`), they are stacked by rows into one
/// matrix (the parts give theirs up, so nothing is stored twice); the outputs are the stacked
/// product's columns, split back, each with its part's bias. Each output element has its own
/// accumulator, so the results are the parts' bits.
#[derive(Debug, Clone)]
pub struct FusedLinear {
    /// The parts as layers of their own: empty when the weights were read stacked
    /// (`from_stacked`); else what runs when nothing stacks, and the dense copies, if any.
    parts: Vec<Linear>,
    /// The parts' weights stacked, with each part's width.
    stacked: Option<(Stacked, Vec<usize>)>,
    /// Each part's bias.
    biases: Vec<Option<Tensor>>,
}

/// Stacked weights of one kind.
#[derive(Debug, Clone)]
enum Stacked {
    Q8(Arc<Q8Matrix>),
    KQuant(Arc<KQuantMatrix>),
    /// bf16 or f16 rows `[Σ out_i, in]`, with the parts' biases stacked in the same dtype.
    Dense {
        weight: Tensor,
        bias: Option<Tensor>,
    },
}

/// The parts' dense matrices stacked by rows, when every part is a plain bf16 or f16 matrix of
/// one dtype (f32 matrices stay apart: the CPU's tests hold them to the unstacked bits), with
/// their biases stacked alike (a part without one adds zeros).
fn stack_dense(parts: &mut [Linear]) -> Result<Option<(Stacked, Vec<usize>)>> {
    let dense: Option<Vec<&Tensor>> = parts.iter().map(Linear::plain_dense).collect();
    let Some(dense) = dense else {
        return Ok(None);
    };
    let dtype = dense[0].dtype();
    if !matches!(dtype, DType::BF16 | DType::F16) || dense.iter().any(|w| w.dtype() != dtype) {
        return Ok(None);
    }
    let widths: Vec<usize> = dense
        .iter()
        .map(|w| w.dim(0))
        .collect::<candle_core::Result<_>>()?;
    let bias = match parts.iter().any(|p| p.bias().is_some()) {
        true => {
            let device = dense[0].device().clone();
            let biases = parts
                .iter()
                .zip(&widths)
                .map(|(p, &w)| match p.bias() {
                    Some(b) => b.to_dtype(dtype),
                    None => Tensor::zeros(w, dtype, &device),
                })
                .collect::<candle_core::Result<Vec<_>>>()?;
            Some(Tensor::cat(&biases, 0)?)
        }
        false => None,
    };
    let weight = Tensor::cat(&dense, 0)?;
    parts.iter_mut().for_each(|p| drop(p.take_dense()));
    Ok(Some((Stacked::Dense { weight, bias }, widths)))
}

impl FusedLinear {
    /// Parts whose weights were read as one stacked matrix (`WeightSource::get_stacked`), each
    /// `widths[i]` rows wide, with their biases.
    pub fn from_stacked(
        weights: PackedMatrix,
        widths: Vec<usize>,
        biases: Vec<Option<Tensor>>,
    ) -> Self {
        let stacked = match weights {
            PackedMatrix::Q8(m) => Stacked::Q8(m),
            PackedMatrix::KQuant(m) => Stacked::KQuant(m),
        };
        Self {
            parts: Vec::new(),
            stacked: Some((stacked, widths)),
            biases,
        }
    }

    pub fn new(mut parts: Vec<Linear>) -> Result<Self> {
        let dense = match parts.len() < 2 {
            true => None,
            false => stack_dense(&mut parts)?,
        };
        let stacked = if parts.len() < 2 {
            None
        } else if dense.is_some() {
            dense
        } else if parts.iter().all(Linear::has_q8) {
            let q8: Vec<Arc<Q8Matrix>> = parts.iter_mut().filter_map(Linear::take_q8).collect();
            let widths = q8.iter().map(|m| m.rows()).collect();
            let refs: Vec<&Q8Matrix> = q8.iter().map(Arc::as_ref).collect();
            Some((Stacked::Q8(Arc::new(Q8Matrix::stack_rows(&refs)?)), widths))
        } else {
            let refs: Option<Vec<&KQuantMatrix>> = parts.iter().map(Linear::kquant).collect();
            match refs.map(|r| KQuantMatrix::stack_rows(&r)) {
                Some(Ok(stacked)) => {
                    let widths = parts
                        .iter_mut()
                        .filter_map(Linear::take_kquant)
                        .map(|k| k.rows())
                        .collect();
                    Some((Stacked::KQuant(Arc::new(stacked)), widths))
                }
                // Parts of mixed kinds or types run one by one.
                _ => None,
            }
        };
        let biases = parts.iter().map(|p| p.bias().cloned()).collect();
        Ok(Self {
            parts,
            stacked,
            biases,
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
        let dense = rows >= Q8_MAX_ROWS
            && !self.parts.is_empty()
            && self.parts.iter().all(Linear::has_dense);
        let Some((stacked, widths)) = self.stacked.as_ref().filter(|_| !dense) else {
            return self.parts.iter().map(|p| p.forward(x)).collect();
        };
        let y = match stacked {
            Stacked::Q8(m) => q8_matmul(x, m)?,
            Stacked::KQuant(m) => kquant_matmul(x, m)?,
            Stacked::Dense { .. } => {
                let y = self.forward_stacked(x)?.ok_or_else(|| {
                    crate::ModelError::Invalid("a dense stack without its product".into())
                })?;
                // The stacked biases are already in; each part's output is its columns.
                let y = y.to_dtype(x.dtype())?;
                let mut start = 0;
                let mut outputs = Vec::with_capacity(widths.len());
                for &width in widths {
                    outputs.push(y.narrow(1, start, width)?.contiguous()?);
                    start += width;
                }
                return Ok(outputs);
            }
        };
        let mut outputs = Vec::with_capacity(widths.len());
        let mut start = 0;
        for (bias, &width) in self.biases.iter().zip(widths) {
            let out = y.narrow(1, start, width)?;
            outputs.push(match bias {
                Some(b) => out.broadcast_add(b)?,
                None => out.contiguous()?,
            });
            start += width;
        }
        Ok(outputs)
    }
}

impl FusedLinear {
    /// The dtype of the stacked dense matrix, when the parts were stacked as one (bf16 or f16).
    pub fn dense_dtype(&self) -> Option<DType> {
        match &self.stacked {
            Some((Stacked::Dense { weight, .. }, _)) => Some(weight.dtype()),
            _ => None,
        }
    }

    /// One GEMM over the stacked dense matrix, biases added, left in the matrix's dtype:
    /// `[rows, Σ out_i]`, each row the parts' outputs side by side. `None` unless the parts were
    /// stacked as a dense matrix ([`Self::dense_dtype`]).
    pub fn forward_stacked(&self, x: &Tensor) -> Result<Option<Tensor>> {
        let Some(y) = self.stacked_product(x)? else {
            return Ok(None);
        };
        Ok(Some(match self.stacked_bias() {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        }))
    }

    /// [`Self::forward_stacked`] without the biases (for a kernel that adds them itself).
    pub fn stacked_product(&self, x: &Tensor) -> Result<Option<Tensor>> {
        let Some((Stacked::Dense { weight, .. }, _)) = &self.stacked else {
            return Ok(None);
        };
        Ok(Some(x.to_dtype(weight.dtype())?.matmul(&weight.t()?)?))
    }

    /// The stacked dense matrix's biases, side by side in its dtype (zeros for a part without).
    pub fn stacked_bias(&self) -> Option<&Tensor> {
        match &self.stacked {
            Some((Stacked::Dense { bias, .. }, _)) => bias.as_ref(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::layers::DenseLayout;
    use crate::weights::Weight;

    /// A Q8_0 layer `[out, 64]` with a bias, from seeded random values.
    fn layer(out: usize, seed: u64, dense_copy: bool) -> Linear {
        let dev = Device::Cpu;
        let w = random(&[out, 64], seed);
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        let bias = random(&[out], seed + 100);
        let layout = DenseLayout {
            dense_copy,
            ..DenseLayout::F32
        };
        Linear::new(Weight::Quantized(Arc::new(q)), Some(bias), layout, &dev).unwrap()
    }

    fn random(shape: &[usize], seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let values: Vec<f32> = (0..n as u64)
            .map(|i| {
                let x = (i + 1).wrapping_mul(6_364_136_223_846_793_005)
                    ^ seed.wrapping_mul(1_442_695_040_888_963_407);
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_stacked_product_gives_each_part_its_own_bits() {
        for dense_copy in [false, true] {
            let widths = [96, 32, 32];
            let alone: Vec<Linear> = widths
                .iter()
                .zip(1..)
                .map(|(&w, s)| layer(w, s, dense_copy))
                .collect();
            let fused = FusedLinear::new(alone.clone()).unwrap();
            assert!(fused.stacked.is_some());
            assert_eq!(fused.out_features().unwrap(), widths);
            // 3 rows take the int8 product; 70 rows the dense copies where there are some.
            for rows in [3, 70] {
                let x = random(&[rows, 64], 7 + rows as u64);
                let outputs = fused.forward(&x).unwrap();
                for (part, out) in alone.iter().zip(&outputs) {
                    let expected = part.forward(&x).unwrap();
                    assert_eq!(out.dims(), expected.dims());
                    assert_eq!(
                        out.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        expected.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                        "rows {rows}, dense copy {dense_copy}"
                    );
                }
            }
        }
    }

    #[test]
    fn parts_without_q8_weights_run_one_by_one() {
        let dense = |seed| {
            Linear::new(
                Weight::Dense(random(&[8, 64], seed)),
                None,
                DenseLayout::F32,
                &Device::Cpu,
            )
            .unwrap()
        };
        let fused = FusedLinear::new(vec![dense(1), dense(2)]).unwrap();
        assert!(fused.stacked.is_none());
        let x = random(&[2, 64], 3);
        let outputs = fused.forward(&x).unwrap();
        assert_eq!(outputs.len(), 2);
        assert_eq!(outputs[1].dims(), [2, 8]);
    }
}
