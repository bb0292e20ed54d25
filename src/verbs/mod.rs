//! verbs (skeleton).
