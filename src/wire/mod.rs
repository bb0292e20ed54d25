//! wire (skeleton).
