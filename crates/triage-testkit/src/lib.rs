//! Helpers that the workspace's tests share, so that each is written once: only ever a
//! dev-dependency, never part of a shipped crate. Failures panic, as a test's helpers should.
#![forbid(unsafe_code)]

use candle_core::Tensor;

/// Values whose largest element-wise distance can be measured: tensors, and rows of `f32`.
pub trait AbsDiff {
    /// The largest `|a - b|` over all elements, NaN when either side holds a NaN (so that
    /// `diff < tol` fails: paged-attention tests poison unused cache slots with NaN). Panics when
    /// the shapes differ.
    fn max_abs_diff(&self, other: &Self) -> f32;
}

/// The largest element-wise `|a - b|` (tensors of one shape, any float dtype, or `f32` rows of
/// one length); NaN when either side holds a NaN. Panics when the shapes differ.
pub fn max_abs_diff<T: AbsDiff + ?Sized>(a: &T, b: &T) -> f32 {
    a.max_abs_diff(b)
}

/// The larger of two distances, NaN when either is (`f32::max` would drop the NaN).
fn nan_max(m: f32, d: f32) -> f32 {
    if m.is_nan() || d.is_nan() {
        f32::NAN
    } else {
        m.max(d)
    }
}

impl AbsDiff for Tensor {
    fn max_abs_diff(&self, other: &Self) -> f32 {
        assert_eq!(self.shape(), other.shape(), "tensors of different shapes");
        let values = |t: &Tensor| {
            t.flatten_all()
                .and_then(|t| t.to_dtype(candle_core::DType::F32))
                .and_then(|t| t.to_vec1::<f32>())
                .expect("a float tensor")
        };
        values(self).max_abs_diff(&values(other))
    }
}

impl AbsDiff for [f32] {
    fn max_abs_diff(&self, other: &Self) -> f32 {
        assert_eq!(self.len(), other.len(), "rows of different lengths");
        let diffs = self.iter().zip(other).map(|(x, y)| (x - y).abs());
        diffs.fold(0f32, nan_max)
    }
}

impl AbsDiff for Vec<f32> {
    fn max_abs_diff(&self, other: &Self) -> f32 {
        self.as_slice().max_abs_diff(other.as_slice())
    }
}

impl AbsDiff for [Vec<f32>] {
    fn max_abs_diff(&self, other: &Self) -> f32 {
        assert_eq!(self.len(), other.len(), "different numbers of rows");
        self.iter()
            .zip(other)
            .map(|(x, y)| x.max_abs_diff(y))
            .fold(0f32, nan_max)
    }
}

impl AbsDiff for Vec<Vec<f32>> {
    fn max_abs_diff(&self, other: &Self) -> f32 {
        self.as_slice().max_abs_diff(other.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn tensors_and_rows_give_the_same_largest_difference() {
        let a = vec![vec![1.0f32, -2.0], vec![0.5, 4.0]];
        let b = vec![vec![1.5f32, -2.0], vec![0.5, 1.0]];
        assert_eq!(max_abs_diff(&a, &b), 3.0);
        assert_eq!(max_abs_diff(a.as_slice(), b.as_slice()), 3.0);
        assert_eq!(max_abs_diff(&a[0], &b[0]), 0.5);
        let t = |rows: &Vec<Vec<f32>>| Tensor::new(rows.clone(), &Device::Cpu).unwrap();
        assert_eq!(max_abs_diff(&t(&a), &t(&b)), 3.0);
        assert_eq!(max_abs_diff(&t(&a), &t(&a)), 0.0);
    }

    #[test]
    fn a_nan_on_either_side_is_never_within_tolerance() {
        let a = vec![1.0f32, f32::NAN, 3.0];
        let b = vec![1.0f32, 2.0, 3.0];
        assert!(max_abs_diff(&a, &b).is_nan());
        assert!(max_abs_diff(&b, &a).is_nan());
        let rows = |r: &Vec<f32>| vec![vec![0.0f32], r.clone()];
        assert!(max_abs_diff(&rows(&a), &rows(&b)).is_nan());
        let t = |r: &Vec<f32>| Tensor::new(r.clone(), &Device::Cpu).unwrap();
        assert!(max_abs_diff(&t(&a), &t(&b)).is_nan());
    }

    #[test]
    #[should_panic(expected = "different lengths")]
    fn rows_of_different_lengths_panic() {
        max_abs_diff(&[1.0f32, 2.0][..], &[1.0f32][..]);
    }
}
