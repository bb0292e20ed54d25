//! Command-line tools built on the providers (the `ipoib-cm` subcommands other than the daemon).

pub mod rc_pingpong;
pub mod ud_pingpong;
