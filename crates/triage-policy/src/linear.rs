//! The small linear models the policies learn: median imputation and standardisation, logistic
//! regression (query classifier, combined escalation score) and ridge regression (retrieval-gain
//! policy). Here, with the policies, so that the router fits them and the evaluation scores
//! signals out of fold with the same code, without an engine. Written rather
//! than pulled from a crate because each is a few dozen lines and the fits are tiny (hundreds of
//! rows, at most 384 features); linfa would add a BLAS-sized dependency tree for them.

use serde::{Deserialize, Serialize};

use crate::error::{PolicyError, Result};

/// Per-feature median (for missing values), mean and standard deviation, fitted on training rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Standardizer {
    pub medians: Vec<f64>,
    pub means: Vec<f64>,
    pub stds: Vec<f64>,
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn check_rows(rows: &[Vec<f32>]) -> Result<usize> {
    let dim = rows
        .first()
        .map(Vec::len)
        .ok_or_else(|| PolicyError::Fit("no training rows".into()))?;
    if dim == 0 || rows.iter().any(|r| r.len() != dim) {
        return Err(PolicyError::Fit(
            "training rows must all have the same, non-zero number of features".into(),
        ));
    }
    Ok(dim)
}

impl Standardizer {
    /// Fit on `rows`; NaN marks a missing value (ignored here, imputed with the median later).
    pub fn fit(rows: &[Vec<f32>]) -> Result<Self> {
        let dim = check_rows(rows)?;
        let mut medians = Vec::with_capacity(dim);
        for j in 0..dim {
            let present = rows
                .iter()
                .map(|r| f64::from(r[j]))
                .filter(|v| v.is_finite())
                .collect();
            medians.push(median(present));
        }
        let mut s = Self {
            medians,
            means: vec![0.0; dim],
            stds: vec![1.0; dim],
        };
        let imputed: Vec<Vec<f64>> = rows.iter().map(|r| s.impute(r)).collect();
        let n = imputed.len() as f64;
        for j in 0..dim {
            let mean = imputed.iter().map(|r| r[j]).sum::<f64>() / n;
            let var = imputed.iter().map(|r| (r[j] - mean).powi(2)).sum::<f64>() / n;
            s.means[j] = mean;
            // A constant feature carries no information: leave it centred at zero.
            s.stds[j] = if var > 1e-12 { var.sqrt() } else { 1.0 };
        }
        Ok(s)
    }

    pub fn dim(&self) -> usize {
        self.means.len()
    }

    fn impute(&self, row: &[f32]) -> Vec<f64> {
        row.iter()
            .zip(&self.medians)
            .map(|(&v, &m)| if v.is_finite() { f64::from(v) } else { m })
            .collect()
    }

    /// Impute and standardise one row.
    pub fn transform(&self, row: &[f32]) -> Result<Vec<f64>> {
        if row.len() != self.dim() {
            return Err(PolicyError::Fit(format!(
                "expected {} features, got {}",
                self.dim(),
                row.len()
            )));
        }
        Ok(self
            .impute(row)
            .iter()
            .zip(self.means.iter().zip(&self.stds))
            .map(|(v, (m, s))| (v - m) / s)
            .collect())
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn sigmoid(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// P(label) = σ(w·standardise(x) + b).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogisticModel {
    pub standardizer: Standardizer,
    pub weights: Vec<f64>,
    pub bias: f64,
}

impl LogisticModel {
    /// Fit by full-batch gradient descent on the L2-penalised mean log-loss (`l2` times the
    /// squared weights, bias unpenalised). Standardised features make a fixed step converge.
    pub fn fit(rows: &[Vec<f32>], labels: &[bool], l2: f64) -> Result<Self> {
        if rows.len() != labels.len() {
            return Err(PolicyError::Fit("one label per row".into()));
        }
        let standardizer = Standardizer::fit(rows)?;
        let x: Vec<Vec<f64>> = rows
            .iter()
            .map(|r| standardizer.transform(r))
            .collect::<Result<_>>()?;
        let y: Vec<f64> = labels.iter().map(|&l| f64::from(u8::from(l))).collect();
        let (n, dim) = (x.len() as f64, standardizer.dim());
        let (mut w, mut b) = (vec![0.0; dim], 0.0);
        let rate = 0.5;
        for _ in 0..500 {
            let mut grad = vec![0.0; dim];
            let mut grad_b = 0.0;
            for (row, &target) in x.iter().zip(&y) {
                let err = sigmoid(dot(&w, row) + b) - target;
                grad.iter_mut().zip(row).for_each(|(g, v)| *g += err * v);
                grad_b += err;
            }
            for (wj, gj) in w.iter_mut().zip(&grad) {
                *wj -= rate * (gj / n + 2.0 * l2 * *wj);
            }
            b -= rate * grad_b / n;
        }
        Ok(Self {
            standardizer,
            weights: w,
            bias: b,
        })
    }

    pub fn predict(&self, row: &[f32]) -> Result<f64> {
        let x = self.standardizer.transform(row)?;
        Ok(sigmoid(dot(&self.weights, &x) + self.bias))
    }
}

/// A mass-mean probe: the direction from the right answers' mean standardised state to the
/// wrong answers'; an answer's score is its standardised state along it (larger: more likely
/// wrong). It has no step size or penalty to tune, which a few hundred answers in a thousand
/// dimensions could not choose reliably.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MassMeanProbe {
    pub mean: Vec<f64>,
    pub scale: Vec<f64>,
    pub direction: Vec<f64>,
}

impl MassMeanProbe {
    /// From states labelled wrong (`true`) or right; `None` without both labels. States of
    /// another width than the first are left out.
    pub fn fit(rows: &[(&[f32], bool)]) -> Option<Self> {
        let width = rows.first()?.0.len();
        let rows: Vec<&(&[f32], bool)> = rows.iter().filter(|r| r.0.len() == width).collect();
        let wrong = rows.iter().filter(|r| r.1).count();
        let right = rows.len() - wrong;
        if wrong == 0 || right == 0 {
            return None;
        }
        let n = rows.len() as f64;
        let mut mean = vec![0f64; width];
        for r in &rows {
            mean.iter_mut()
                .zip(r.0)
                .for_each(|(m, &x)| *m += f64::from(x) / n);
        }
        let mut var = vec![0f64; width];
        for r in &rows {
            var.iter_mut()
                .zip(r.0.iter().zip(&mean))
                .for_each(|(v, (&x, m))| *v += (f64::from(x) - m).powi(2) / n);
        }
        // A constant dimension says nothing: a unit scale leaves it at zero after centring.
        let scale: Vec<f64> = var
            .iter()
            .map(|v| if *v > 1e-12 { v.sqrt() } else { 1.0 })
            .collect();
        let mut direction = vec![0f64; width];
        for r in &rows {
            let sign = if r.1 {
                1.0 / wrong as f64
            } else {
                -1.0 / right as f64
            };
            for (j, &x) in r.0.iter().enumerate() {
                direction[j] += sign * (f64::from(x) - mean[j]) / scale[j];
            }
        }
        Some(Self {
            mean,
            scale,
            direction,
        })
    }

    /// The threshold that escalates at most `max_false_escalation` of the right answers among
    /// `rows` (an answer escalates when its score exceeds it): the highest right score but the
    /// allowed few. `None` without right answers.
    pub fn threshold(
        &self,
        rows: &[(&[f32], bool)],
        max_false_escalation: f64,
    ) -> Result<Option<f64>> {
        let mut right = rows
            .iter()
            .filter(|r| !r.1)
            .map(|r| self.score(r.0))
            .collect::<Result<Vec<f64>>>()?;
        if right.is_empty() {
            return Ok(None);
        }
        right.sort_by(f64::total_cmp);
        let allowed = (max_false_escalation * right.len() as f64).floor() as usize;
        Ok(Some(right[right.len() - 1 - allowed.min(right.len() - 1)]))
    }

    /// The state's score; a state of another width than the probe's is an error.
    pub fn score(&self, x: &[f32]) -> Result<f64> {
        if x.len() != self.direction.len() {
            return Err(PolicyError::Fit(format!(
                "a state of {} values for a probe of {}",
                x.len(),
                self.direction.len()
            )));
        }
        Ok(x.iter()
            .enumerate()
            .map(|(j, &v)| self.direction[j] * (f64::from(v) - self.mean[j]) / self.scale[j])
            .sum())
    }
}

/// ŷ = w·standardise(x) + b, fitted in closed form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RidgeModel {
    pub standardizer: Standardizer,
    pub weights: Vec<f64>,
    pub bias: f64,
}

impl RidgeModel {
    /// Minimise Σ(y − ŷ)² + penalty·|w|² (scikit-learn's `Ridge(alpha=penalty)` on standardised
    /// features; the bias is the mean target and is not penalised).
    pub fn fit(rows: &[Vec<f32>], targets: &[f64], penalty: f64) -> Result<Self> {
        if rows.len() != targets.len() {
            return Err(PolicyError::Fit("one target per row".into()));
        }
        let standardizer = Standardizer::fit(rows)?;
        let x: Vec<Vec<f64>> = rows
            .iter()
            .map(|r| standardizer.transform(r))
            .collect::<Result<_>>()?;
        let dim = standardizer.dim();
        let mean_y = targets.iter().sum::<f64>() / targets.len() as f64;
        let mut gram = vec![vec![0.0; dim]; dim];
        let mut rhs = vec![0.0; dim];
        for (row, &t) in x.iter().zip(targets) {
            for i in 0..dim {
                rhs[i] += row[i] * (t - mean_y);
                for j in 0..dim {
                    gram[i][j] += row[i] * row[j];
                }
            }
        }
        for (i, r) in gram.iter_mut().enumerate() {
            r[i] += penalty;
        }
        let weights = solve(gram, rhs)?;
        Ok(Self {
            standardizer,
            weights,
            bias: mean_y,
        })
    }

    pub fn predict(&self, row: &[f32]) -> Result<f64> {
        let x = self.standardizer.transform(row)?;
        Ok(dot(&self.weights, &x) + self.bias)
    }
}

/// Solve `a·x = b` by Gaussian elimination with partial pivoting (`a` is small and, with a
/// positive penalty, positive definite).
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Result<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap_or(col);
        if a[pivot][col].abs() < 1e-12 {
            return Err(PolicyError::Fit("singular system in ridge fit".into()));
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let (head, tail) = a.split_at_mut(col + 1);
        let pivot_row = &head[col];
        for (offset, row) in tail.iter_mut().enumerate() {
            let f = row[col] / pivot_row[col];
            row.iter_mut()
                .zip(pivot_row)
                .skip(col)
                .for_each(|(x, p)| *x -= f * p);
            b[col + 1 + offset] -= f * b[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - s) / a[row][row];
    }
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auroc;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    }

    #[test]
    fn ridge_recovers_a_linear_target_and_shrinks_with_the_penalty() {
        let mut seed = 7;
        let rows: Vec<Vec<f32>> = (0..200)
            .map(|_| vec![lcg(&mut seed), lcg(&mut seed), lcg(&mut seed)])
            .collect();
        let targets: Vec<f64> = rows
            .iter()
            .map(|r| 3.0 * f64::from(r[0]) - 2.0 * f64::from(r[2]) + 0.5)
            .collect();
        let fit = RidgeModel::fit(&rows, &targets, 1e-6).unwrap();
        for (r, t) in rows.iter().zip(&targets).take(20) {
            assert!((fit.predict(r).unwrap() - t).abs() < 1e-4);
        }
        let shrunk = RidgeModel::fit(&rows, &targets, 1000.0).unwrap();
        let norm = |m: &RidgeModel| m.weights.iter().map(|w| w * w).sum::<f64>();
        assert!(norm(&shrunk) < 0.2 * norm(&fit));
    }

    #[test]
    fn missing_values_take_the_training_median() {
        let rows = vec![vec![1.0, 5.0], vec![2.0, f32::NAN], vec![9.0, 7.0]];
        let s = Standardizer::fit(&rows).unwrap();
        assert_eq!(s.medians, vec![2.0, 6.0]);
        let a = s.transform(&[f32::NAN, f32::NAN]).unwrap();
        let b = s.transform(&[2.0, 6.0]).unwrap();
        assert_eq!(a, b);
        assert!(s.transform(&[1.0]).is_err());
    }

    #[test]
    fn logistic_separates_two_clouds() {
        let mut seed = 3;
        let mut rows = Vec::new();
        let mut labels = Vec::new();
        for i in 0..300 {
            let label = i % 2 == 0;
            let shift = if label { 1.5 } else { -1.5 };
            rows.push(vec![lcg(&mut seed) + shift, lcg(&mut seed)]);
            labels.push(label);
        }
        let m = LogisticModel::fit(&rows, &labels, 1e-4).unwrap();
        assert!(m.predict(&[2.0, 0.0]).unwrap() > 0.9);
        assert!(m.predict(&[-2.0, 0.0]).unwrap() < 0.1);
        let scores: Vec<f64> = rows.iter().map(|r| m.predict(r).unwrap()).collect();
        assert!(auroc(&scores, &labels).unwrap() > 0.95);
    }
}
