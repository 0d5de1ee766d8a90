//! Random inputs shared by the kernel tests, and conversion to each kernel dtype.

use candle_core::{Device, Tensor};
use half::{bf16, f16};
use rand::{rngs::StdRng, Rng};
use triage_kernel_sim::Elem;

/// A kernel element type that is also a candle dtype, with conversions from and to f32.
pub trait Dtype: Elem + candle_core::WithDType {
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl Dtype for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl Dtype for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl Dtype for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// Standard normal samples (Box–Muller), scaled.
pub fn normal(rng: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let (u, v): (f32, f32) = (rng.random_range(f32::EPSILON..1.0), rng.random());
            scale * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
        })
        .collect()
}

/// `xs` converted to `T`, stored after `offset` unused leading elements: the returned vector's
/// slice `[offset..]` starts `offset` elements past an allocation's (16-byte aligned) start.
pub fn convert<T: Dtype>(xs: &[f32], offset: usize) -> Vec<T> {
    std::iter::repeat_n(T::from_f32(0.5), offset)
        .chain(xs.iter().map(|&x| T::from_f32(x)))
        .collect()
}

/// A CPU tensor of `T` values.
pub fn tensor<T: candle_core::WithDType>(xs: &[T], shape: &[usize]) -> Tensor {
    Tensor::from_slice(xs, shape, &Device::Cpu).expect("sizes match the shape")
}

/// `|got - want| <= abs + rel·|want|`, with NaN equal to NaN and infinities equal to themselves.
pub fn close(got: f32, want: f32, abs: f32, rel: f32) -> bool {
    (got.is_nan() && want.is_nan()) || got == want || (got - want).abs() <= abs + rel * want.abs()
}
