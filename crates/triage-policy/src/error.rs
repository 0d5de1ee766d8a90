//! The error type of `triage-policy`.

/// A fit refused, a model that cannot score a row, or a frozen model file that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A fit refused: no rows, rows of different widths, one label per row missing, a singular
    /// system; or a row the model cannot score.
    #[error("{0}")]
    Fit(String),
    /// Anything else the caller gave: a frozen file unreadable, edited or fitted on other
    /// inputs, a setting out of range.
    #[error("{0}")]
    Invalid(String),
}

/// `Result` with [`PolicyError`].
pub type Result<T> = std::result::Result<T, PolicyError>;
