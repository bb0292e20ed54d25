//! soft (skeleton).
//! [`transport`] is the provider's UDP edge.
pub mod transport;
