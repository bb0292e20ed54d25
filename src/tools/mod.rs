//! Command-line tools built on the providers (the `ipoib-cm` subcommands other than the daemon).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod exchange;
pub mod perf;
pub mod rc_pingpong;
pub mod ud_pingpong;
