//! Unit tests of the soft provider.
