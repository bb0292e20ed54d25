//! sys (skeleton).
