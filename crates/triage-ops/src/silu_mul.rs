//! The MLP's gate: `silu(gate) · up` over the stacked gate/up projection's output
//! (`[rows, 2 · inter]`, each row `[gate | up]`) into `[rows, inter]`, in one pass and in the
//! input's dtype (bf16 activations stay bf16 between the GEMMs). Computed in f32 per element.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};

use crate::elem::Elem;
use crate::{OpsError, Result};

struct SiluMul;

/// `silu(g) · u` for one element, in f32 (the kernel's expression).
fn gated(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

fn cpu_rows<T: Elem>(gate_up: &[T], inter: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(gate_up.len() / 2);
    for row in gate_up.chunks_exact(2 * inter) {
        let (gate, up) = row.split_at(inter);
        out.extend(
            gate.iter()
                .zip(up)
                .map(|(g, u)| T::narrow(gated(g.widen(), u.widen()))),
        );
    }
    out
}

/// `[rows, 2 · inter]` → `(rows, inter)`, or an error for an odd width.
fn check(dims: &[usize]) -> candle_core::Result<(usize, usize)> {
    match dims {
        [rows, width] if width.is_multiple_of(2) && *width > 0 => Ok((*rows, width / 2)),
        _ => candle_core::bail!("silu_mul: expected [rows, 2 · inter], got {dims:?}"),
    }
}

impl CustomOp1 for SiluMul {
    fn name(&self) -> &'static str {
        "silu-mul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (rows, inter) = check(layout.dims())?;
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("silu_mul: contiguous input only")
        };
        let out = match storage {
            CpuStorage::F32(xs) => CpuStorage::F32(cpu_rows(&xs[start..end], inter)),
            CpuStorage::F16(xs) => CpuStorage::F16(cpu_rows(&xs[start..end], inter)),
            CpuStorage::BF16(xs) => CpuStorage::BF16(cpu_rows(&xs[start..end], inter)),
            _ => candle_core::bail!("silu_mul: f32, f16 or bf16 input"),
        };
        Ok((out, Shape::from((rows, inter))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let (rows, inter) = check(layout.dims())?;
        let out = crate::cuda::silu_mul_fwd(storage, layout, rows, inter)?;
        Ok((out, Shape::from((rows, inter))))
    }
}

/// `silu(gate) · up` of `gate_up` (`[rows, 2 · inter]`, f32, f16 or bf16), as `[rows, inter]`
/// in the same dtype.
pub fn silu_mul(gate_up: &Tensor) -> Result<Tensor> {
    if !matches!(gate_up.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        return Err(OpsError::InvalidArgument(format!(
            "silu_mul: {:?} input",
            gate_up.dtype()
        )));
    }
    Ok(gate_up.contiguous()?.apply_op1_no_bwd(&SiluMul)?)
}

/// Reference: the halves split, `candle_nn`'s silu and a product, in f32, back to the dtype.
pub fn silu_mul_slow(gate_up: &Tensor) -> Result<Tensor> {
    let (_, width) = gate_up.dims2()?;
    let x = gate_up.to_dtype(DType::F32)?;
    let (gate, up) = (
        x.narrow(1, 0, width / 2)?,
        x.narrow(1, width / 2, width / 2)?,
    );
    Ok((candle_nn::ops::silu(&gate)? * up)?.to_dtype(gate_up.dtype())?)
}

#[cfg(test)]
mod tests {
    use candle_core::Device;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn silu_mul_matches_the_reference_in_every_dtype() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let (rows, inter) = (5, 37);
        let values: Vec<f32> = (0..rows * 2 * inter)
            .map(|_| rng.random_range(-6.0..6.0))
            .collect();
        let x = Tensor::from_vec(values, (rows, 2 * inter), &Device::Cpu).unwrap();
        // f32: the same expression up to exp's rounding; f16/bf16: one rounding of the result,
        // whose value is within a few units of the inputs' magnitude.
        for (dtype, tol) in [(DType::F32, 1e-5), (DType::F16, 1e-2), (DType::BF16, 5e-2)] {
            let x = x.to_dtype(dtype).unwrap();
            let got = silu_mul(&x).unwrap();
            assert_eq!((got.dims(), got.dtype()), (&[rows, inter][..], dtype));
            let want = silu_mul_slow(&x).unwrap();
            let diff = (got.to_dtype(DType::F32).unwrap() - want.to_dtype(DType::F32).unwrap())
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff <= tol, "{dtype:?}: {diff}");
        }
        assert!(silu_mul(&Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap()).is_err());
    }
}
