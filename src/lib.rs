//! # ipoib-cm
//!
//! IP over InfiniBand connected mode (RFC 4391 / RFC 4755, as Linux's `ipoib_cm` does it) from
//! user space.
//!
//! Layers, bottom up:
//!
//! - [`wire`]: packet codecs (RoCEv2 BTH/AETH/DETH/RETH/ImmDt and the ICRC). No I/O, no clock.
//! - [`verbs`]: the provider seam. A [`verbs::Verbs`] trait modelled on libibverbs, with its
//!   contract (flush on ERR, Last WQE Reached for SRQ-attached QPs, completion order) written
//!   in its docs, plus the IBTA QP state machine and a registered buffer pool.
//! - [`soft`]: the embedded default provider, a software RC/UD engine that speaks genuine
//!   RoCEv2 over UDP. Its core is sans-IO; [`soft::transport`] is the thin UDP edge.
//! - [`cm`]: the InfiniBand Communication Manager state machine (REQ/REP/RTU/DREQ/DREP/REJ,
//!   retries, TimeWait), sans-IO like the rest.
//! - [`mad`]: the CM MAD transports the driver owns: QP1 on a provider that lets us own it
//!   (the software one), or a UDP side channel beside kernel verbs.
//! - `hw` (feature `verbs`): the libibverbs hardware provider; with [`sys`], the only other
//!   module allowed `unsafe`.
//! - [`sys`]: the only module allowed `unsafe`: OS calls no safe crate exposes (socket options,
//!   `recvmsg` with packet info, the TUN device and its ioctls).
//! - [`sim`]: a deterministic in-memory fabric with a virtual clock, for tests.
//! - [`tools`]: the `rc-pingpong` tool.
//! - [`daemon`]: the daemon's operator surface: configuration, the status snapshot and the
//!   control socket.
//! - [`timer`]: a hierarchical timer wheel (O(1) insert/cancel) for the endpoint's deadlines.
//!
//! Every state machine takes `now: Instant` from its caller; only the binary's event loop reads
//! the clock.

// Library code never unwraps: an error is returned or a case is handled. Tests may
// (`clippy.toml`).
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod choice;
pub mod cm;
pub mod daemon;
pub mod driver;
#[cfg(feature = "verbs")]
pub mod hw;
pub mod ipoib;
pub mod mad;
pub mod sim;
pub mod soft;
pub mod sys;
pub mod timer;
pub mod tools;
pub mod verbs;
pub mod wire;
