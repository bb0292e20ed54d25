//! Helpers shared by the integration tests.
//!
//! Each test binary compiles this module on its own and uses a different part of it.
#![allow(dead_code)]

pub(crate) mod child;
pub(crate) mod lab;
pub(crate) mod netns;
