//! Feature extraction from a model's answer: which tokens are the answer span and their
//! uncertainty, how well the answer is grounded in the retrieved chunks, how much sampled
//! answers agree with it, and the residual-stream states the hidden-state probe reads. The
//! policies that score these live in `triage-policy`.

pub(crate) mod answer_span;
pub(crate) mod grounding;
mod probe_states;
pub(crate) mod sample_agreement;

pub(crate) use probe_states::probe_states;
