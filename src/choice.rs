//! The error of a setting whose value is a name from a fixed set (`connected` or `datagram`,
//! `evict` or `reject`, `qp1` or `udp`, ...). It depends on nothing in the crate, so every
//! layer's `FromStr` of such a setting returns the same error.

/// A name that is none of a setting's choices; displays as `must be "a" or "b" (got "c")`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be {choices} (got {got:?})")]
pub struct ParseChoiceError {
    /// The accepted names, quoted, as a phrase (`"evict" or "reject"`).
    pub choices: &'static str,
    /// What was given.
    pub got: String,
}

impl ParseChoiceError {
    /// `got` is none of `choices`.
    pub fn new(choices: &'static str, got: &str) -> Self {
        Self {
            choices,
            got: got.to_owned(),
        }
    }
}
