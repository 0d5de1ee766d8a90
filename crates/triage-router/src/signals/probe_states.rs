//! The base model's residual stream while it answered, read for the hidden-state probe: per
//! layer asked, the state at the last prompt token and the mean over the first answer tokens.

use triage_types::ProbeStates;

/// From the hidden states of a generation's first tokens (each token's states for `layers`, in
/// order; the first token's are the last prompt token's). Values are rounded to 1e-3 to keep
/// records small; a linear probe does not see the difference.
pub(crate) fn probe_states(layers: &[usize], tokens: &[&[Vec<f32>]]) -> Option<ProbeStates> {
    let first = tokens.first().filter(|t| t.len() == layers.len())?;
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| (x * 1e3).round() / 1e3).collect() };
    let prompt = first.iter().map(|v| round(v)).collect();
    let rest: Vec<&[Vec<f32>]> = tokens[1..]
        .iter()
        .copied()
        .filter(|t| t.len() == layers.len())
        .collect();
    let answer = if rest.is_empty() {
        Vec::new()
    } else {
        (0..layers.len())
            .map(|l| {
                let width = rest[0][l].len();
                let mut mean = vec![0f32; width];
                for t in &rest {
                    mean.iter_mut().zip(&t[l]).for_each(|(m, x)| *m += x);
                }
                let n = rest.len() as f32;
                round(&mean.iter().map(|m| m / n).collect::<Vec<_>>())
            })
            .collect()
    };
    Some(ProbeStates {
        layers: layers.to_vec(),
        prompt,
        answer,
    })
}
