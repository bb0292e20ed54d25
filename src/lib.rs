//! # ipoib-cm
//!
//! IP over InfiniBand connected mode (RFC 4391 / RFC 4755, as Linux's `ipoib_cm` does it) from
//! user space.
//!
//! # Embedding
//!
//! One [`Endpoint`] is one IPoIB interface over one [`Verbs`] provider: the embedded
//! software provider ([`SoftVerbs`], RoCEv2 over UDP, on a [`SoftProvider`] that owns its
//! socket) or, with the feature `verbs`, libibverbs (`hw::HwVerbs`). The caller's loop hands
//! the endpoint what arrived (IP packets from a [`Tun`] device, CM MADs from a
//! [`MadTransport`], the provider's completions) and sends what it returns; see the calling
//! protocol in [`ipoib`]. [`ProviderSources`] registers a provider's descriptors
//! ([`Provider::io_source`]) with a mio registry, and [`Node`] is the whole turn over one
//! interface (provider, endpoint, MAD transport, TUN device) that the daemon's loop is made of. [`Endpoint::snapshot`] gives the state
//! ([`Snapshot`], [`Counters`]) that the daemon's status is made of.
//!
//! # Layers
//!
//! Bottom up; each layer imports only layers below it (`tests/layers.rs` checks this, and that
//! the module graph has no cycle):
//!
//! - [`wire`]: packet codecs with no I/O and no clock: RoCEv2 (BTH, extension headers, GRH,
//!   ICRC), IB CM MADs, IPoIB (encapsulation header, hardware address, ARP, ND, multicast
//!   GIDs), and the identifier newtypes with PSN arithmetic. Depends on nothing.
//! - `sys` (private): OS calls no safe crate exposes (socket options, `recvmsg`/`recvmmsg`
//!   with packet info, `sendmmsg`, the TUN device, peer credentials, `getifaddrs`).
//! - `timer` (hidden): a hierarchical timer wheel (O(1) insert/cancel) for the deadlines of
//!   the CM and the endpoint.
//! - `choice` (private): [`ParseChoiceError`], the error of every setting that names one of
//!   fixed choices. Depends on nothing.
//! - [`verbs`]: the provider seam: the [`Verbs`] trait modelled on libibverbs, with its contract
//!   (flush on ERR, Last WQE Reached for SRQ-attached QPs, completion order) written in its
//!   docs, the IBTA QP state machine, registered buffer pools, and the [`Provider`] side that
//!   names descriptors to watch. On `wire`.
//! - [`soft`]: the software RC/UD engine that speaks RoCEv2 over UDP, sans-IO, with seeded
//!   faults; [`soft::transport`] is its UDP edge. On `verbs`, `wire`, `sys`.
//! - `hw` (feature `verbs`): the libibverbs provider. On `verbs`.
//! - [`sa`]: the sans-IO Subnet Administration client: PathRecord queries with a bounded
//!   (and negative) cache, MCMemberRecord joins and leaves, rejoin on port events. On `wire`.
//! - [`cm`]: the IB Communication Manager state machine (REQ/REP/RTU/DREQ/DREP/REJ/MRA,
//!   retries, TimeWait). On `wire`, `verbs`, `timer`.
//! - [`mad`]: the CM MAD transports a driver owns: QP1 over a provider that lets the caller own
//!   it ([`Gsi`]), or a UDP side channel beside kernel verbs ([`MadUdp`]); [`CmTransport`]
//!   names the choice. On `wire`, `verbs`, `cm`.
//! - [`ipoib`]: the IPoIB-CM endpoint: neighbours, UD, TX and RX connections, the reaper. On
//!   `wire`, `verbs`, `timer`, `cm`.
//! - [`driver`]: where the sans-IO cores meet mio: [`Node`] drives one interface (provider,
//!   endpoint, CM MAD transport, TUN device) a turn at a time in its caller's loop;
//!   [`ProviderSources`] registers a provider's descriptors. On `sys`, `verbs`, `mad`,
//!   `ipoib`.
//! - `setting` (hidden): reading a setting from a flag's text or a config file's value, with
//!   its bounds and errors naming the flag or key, the fault-injection flags declared once,
//!   and the documentation of declared settings; what the daemon's configuration and the
//!   tools' flags share. On `wire`, `verbs`, `soft`.
//! - `sim` (hidden, for tests): a deterministic in-memory fabric with a virtual clock, and
//!   clusters of endpoints on it.
//! - `daemon` (hidden, for the binary): configuration, status, the control socket and the
//!   event loop of `ipoib-cm up`.
//! - `tools` (hidden, for the binary): `rc-pingpong`, `ud-pingpong` and `perf`.
//!
//! The provider conformance suites (`verbs::conformance`, `hw::conformance`) are hidden too:
//! they are test support, public so that `tests/` and both providers can run them.
//!
//! # Sans-IO
//!
//! Every state machine (the soft engine, the CM, the endpoint) takes `now: Instant` from its
//! caller and does no I/O: it acts through the verbs it is handed and returns what to send.
//! Only the event loops on top (the daemon's, the tools') read the clock, once per turn; the
//! same code runs on the simulated fabric with a virtual clock.
//!
//! # Unsafe
//!
//! The crate denies `unsafe_code`. Only `sys` and `hw` opt back in, and every `unsafe` block
//! there carries a `// SAFETY:` comment (`clippy::undocumented_unsafe_blocks` is denied).
//!
//! # Panics
//!
//! Library code never unwraps or expects (denied below; `clippy.toml` lets tests do it), and
//! the layers that read what a peer sends (`wire`, `cm`) also deny indexing and panics in
//! functions that return a `Result`: no input from the wire panics.

#![deny(clippy::unwrap_used, clippy::expect_used)]

mod choice;
pub mod cm;
#[doc(hidden)]
pub mod daemon;
pub mod driver;
#[cfg(feature = "verbs")]
pub mod hw;
pub mod ipoib;
pub mod mad;
pub mod sa;
#[doc(hidden)]
pub mod setting;
#[doc(hidden)]
pub mod sim;
pub mod soft;
mod sys;
#[doc(hidden)]
pub mod timer;
#[doc(hidden)]
pub mod tools;
pub mod verbs;
pub mod wire;

pub use choice::ParseChoiceError;
pub use driver::{Node, NodeConfig, NodeError, ProviderSources};
pub use ipoib::{
    Counters, Endpoint, EndpointConfig, Mode, NeighState, QpBudgetPolicy, RxState, Snapshot,
    TxSnapshot, TxState,
};
pub use mad::{CmTransport, Gsi, Mad, MadTransport, MadUdp};
pub use soft::provider::SoftProvider;
pub use soft::{SoftConfig, SoftVerbs};
pub use sys::tun::Tun;
pub use verbs::{IoSource, Provider, Verbs, VerbsError};
pub use wire::ipoib::HwAddr;
pub use wire::{Gid, QpNum};
