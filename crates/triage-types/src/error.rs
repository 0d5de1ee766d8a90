//! The one error of this crate: a name that is not one of a closed set.

/// A string that names none of a type's values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// What was being named ("query class").
    pub what: &'static str,
    pub name: String,
    /// The accepted names, for the message ("point or global").
    pub expected: &'static str,
}

impl std::fmt::Display for UnknownName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown {} {:?} ({})",
            self.what, self.name, self.expected
        )
    }
}

impl std::error::Error for UnknownName {}
