//! The software RoCEv2 provider: RC and UD queue pairs over UDP, real on the wire.
//!
//! [`SoftVerbs`] is a sans-IO engine implementing [`Verbs`](crate::verbs::Verbs). It never touches a socket or the
//! clock: the caller feeds it datagrams with [`SoftVerbs::handle_datagram`], pulls datagrams to
//! send with [`SoftVerbs::poll_transmit`], and fires timers with [`SoftVerbs::handle_timeout`]
//! at [`SoftVerbs::poll_timeout`]. Every call that depends on time takes `now`. That makes the
//! same code run over real UDP ([`provider::SoftProvider`]) and over the deterministic
//! in-memory fabric of the tests.
//!
//! On the wire it is RoCEv2 as rxe speaks it (`shared/reference/rocev2.md`): BTH/AETH/DETH,
//! ICRC over the masked IP/UDP pseudo-header, P_Key 0xFFFF, TVer 0, FIRST/MIDDLE packets of
//! exactly the path MTU, pad to 4 bytes, AckReq on the last packet (and every 64 packets), ACK
//! coalescing, PSN-sequence NAKs with go-back-N, RNR NAKs with the IBTA timer table, the
//! retransmit timer `4.096 µs · 2^timeout` with `retry_cnt` (backing off 1×, 2×, 4×, 8× while
//! timeouts follow each other without progress), `rnr_retry` 7 = infinite.
//!
//! Everything received is validated before it can touch a QP: unknown QPN, bad ICRC, wrong
//! P_Key or TVer, wrong Q_Key, a source address (for RC also a source port) that is not the
//! QP's peer, a packet the QP's state does not accept, or anything malformed is dropped and
//! counted in [`SoftStats`]. QPNs follow a permutation of the 24-bit space keyed by
//! [`SoftConfig::qpn_seed`], so a restarted process does not reuse its predecessor's QPNs.
//!
//! # Layout
//!
//! The engine is split as rxe is (`drivers/infiniband/sw/rxe`), each file owning its state.
//! Bottom up, each module imports only modules listed before it (`tests/layers.rs` checks
//! that the graph is acyclic), and this file only declares them and re-exports:
//!
//! - [`fault`], `mcast`, [`transport`]: fault injection, multicast groups (their IP multicast
//!   addresses, the unicast fan-out, duplicate suppression), the UDP socket;
//! - `config`, `stats`: [`SoftConfig`] and the limits, [`SoftStats`];
//! - `qp`: the per-QP state: one QP with its attributes and receive queue, the requester's
//!   send queue and window, the responder's sequence state and owed responses (`rxe_qp.c`);
//! - `objects`: PDs, CQs, SRQs, buffer pools and the QP table (`rxe_pool.c`);
//! - `sched`: which QP sends next, and the QP timers;
//! - `device`: everything but the QP table, and what the parts above share: packet building,
//!   completions, receive WQEs, the moves to ERR;
//! - `requester`: the packets of send WQEs (`rxe_req.c`); `completer`: ACKs and NAKs retiring
//!   send WQEs, go-back-N, retries (`rxe_comp.c`); `responder`: requests filling receive
//!   WQEs, their ACKs and NAKs, UD delivery (`rxe_resp.c`);
//! - `engine`: [`SoftVerbs`], the QP table beside the device, the [`Verbs`](crate::verbs::Verbs) implementation,
//!   datagram dispatch in and out, and the timers;
//! - [`provider`]: the provider that joins the engine to the socket.

mod completer;
mod config;
mod device;
mod engine;
pub mod fault;
pub mod ib;
mod mcast;
mod objects;
pub mod provider;
mod qp;
mod reorder;
mod requester;
mod responder;
mod rtt;
mod sched;
pub mod sim_port;
mod stats;
pub mod transport;

pub use crate::wire::grh::{grh_source_gid, GRH_LEN};
pub use config::{
    SoftConfig, DEFAULT_MULTICAST_TTL, DEFAULT_REORDER_HOLD_PACKETS, MAX_RC_MSG, MULTICAST_QPN,
};
pub use engine::{SoftVerbs, MOVES_LATER_BY};
pub use fault::{FaultConfig, FaultInjector, FaultStats, Quirks};
pub use ib::{IbPortAttr, IbPortView, SoftLink};
pub use mcast::{group_addr as multicast_group_addr, DUPLICATE_WINDOW};
pub use stats::SoftStats;

#[cfg(test)]
mod tests;
