//! The float element types the layer ops read and write (f32, f16, bf16), widened to f32 for the
//! arithmetic and rounded back to nearest even, as the kernels' `to_float`/`from_float` do.

use half::{bf16, f16};

/// An element a CPU op computes on in f32.
pub(crate) trait Elem: Copy + Send + Sync + candle_core::WithDType {
    fn widen(self) -> f32;
    fn narrow(x: f32) -> Self;
}

impl Elem for f32 {
    fn widen(self) -> f32 {
        self
    }
    fn narrow(x: f32) -> Self {
        x
    }
}

impl Elem for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Elem for bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(x: f32) -> Self {
        bf16::from_f32(x)
    }
}
