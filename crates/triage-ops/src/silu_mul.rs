//! The MLP's gate: `silu(gate) · up` over the stacked gate/up projection's output
//! (`[rows, 2 · inter]`, each row `[gate | up]`) into `[rows, inter]`, in one pass and in the
//! input's dtype (bf16 activations stay bf16 between the GEMMs). Computed in f32 per element.

#[cfg(feature = "cuda")]
mod cuda;

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
        let out = cuda::silu_mul_fwd(storage, layout, rows, inter)?;
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
