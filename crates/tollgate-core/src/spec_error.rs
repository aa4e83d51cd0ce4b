//! [`SpecError`]: a policy spec (or a part of one, such as a rate) that does not parse.

use std::fmt;

/// A policy spec that does not parse, with what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecError {
    /// The spec as given (empty for a rule set given no spec at all).
    pub spec: String,
    /// What is wrong, naming the algorithm and the bad part.
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.spec.is_empty() {
            return write!(f, "invalid rules: {}", self.message);
        }
        write!(f, "invalid policy '{}': {}", self.spec, self.message)
    }
}
