//! soft (skeleton).
