//! Command-line tools built on the providers (the `ipoib-cm` subcommands other than the daemon).
//!
//! Layout: [`exchange`] is rdma-core's TCP QP-info exchange; [`pingpong`] the ping-pong loop
//! over any provider; `rc_qp` and `soft_loop` the RC QP set-up and the software provider's
//! event loop the tools share; [`rc_pingpong`], [`ud_pingpong`], [`perf`] and [`sa`] (the SA
//! client over umad) the tools, with `hw_pingpong` running rc-pingpong on the libibverbs
//! provider and `rdmacm_pingpong` the same connected by the kernel's CM (feature `verbs`).
//! Every tool takes one [`Options`] and fails with one [`PingpongError`].

mod error;
pub mod exchange;
#[cfg(feature = "verbs")]
pub mod hw_pingpong;
mod options;
pub mod perf;
pub mod pingpong;
pub mod rc_pingpong;
mod rc_qp;
#[cfg(feature = "verbs")]
pub mod rdmacm_pingpong;
pub mod sa;
mod sa_args;
mod sa_node;
pub mod sa_port;
mod soft_loop;
pub mod ud_pingpong;

pub use error::PingpongError;
pub use options::{Options, RcLink, RECV_WRID, ROCE_V2_UDP_PORT, SEND_WRID};
