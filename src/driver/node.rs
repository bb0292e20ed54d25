//! [`Node`]: one IPoIB interface (its TUN device, endpoint, provider and CM MAD transport)
//! driven a turn at a time.

mod interface;
mod kcm_route;
mod recovery;
mod setup;

use super::event_log::{EventLog, Verdict};
pub use interface::addr_list;
pub use kcm_route::KcmRoute;
use kcm_route::KcmRouter;
pub use recovery::{
    DeviceStats, ReopenBackoff, REOPEN_FIRST_DELAY, REOPEN_MAX_DELAY, REOPEN_MAX_FAILURES,
};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use super::tun::{read_tun, write_tun, TunRead, TunStats, TunThrottle};
use super::{KcmStats, KernelCmDriver, ProviderSources, SaDriver};
use crate::cm::LinkLayer;
use crate::ipoib::{Endpoint, EndpointConfig, Interface, KernelCmConfig, EVENT_QUEUE_CAP};
use crate::mad::{self, CmTransport, Gsi, Mad, MadStats, MadTransport, MadUdp, NoMads};
use crate::sa::SaEvent;
use crate::sys::tun::Tun;
use crate::verbs::{Provider, VerbsError};

/// Packets read from the TUN device per turn.
pub const TUN_BATCH: usize = 256;

/// Packets read from the provider in one turn from which their acknowledgements leave before
/// the TUN writes.
pub const EARLY_ACK_BATCH: usize = 8;

/// Whether a TUN read error says the interface was deleted: the device then reads
/// `EBADFD` ("File descriptor in bad state").
fn is_interface_gone(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EBADFD)
}

/// Bytes of the buffer that TUN packets are read into while shutting down with no send buffer
/// free: the largest packet the TUN device hands out.
const DRAIN_READ_BYTES: usize = 65_536;

/// What a [`Node`] is set up with.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    /// Name of the TUN interface to create (a pattern such as `ib%d` lets the kernel pick).
    pub ifname: String,
    /// The endpoint's settings. Its `addrs` are also put on the interface, and its
    /// `drain_timeout` bounds the whole shutdown ([`Node::begin_shutdown`]).
    pub endpoint: EndpointConfig,
    /// How CM MADs travel.
    pub cm_transport: CmTransport,
    /// Where the UDP side channel binds, with [`CmTransport::Udp`].
    pub mad_udp: SocketAddr,
    /// The `--bind` address the kernel's CM listens on, with [`CmTransport::RdmaCm`] (at the
    /// endpoint's `rdma_cm_port`, the service its peers connect to).
    pub rdma_cm_bind: IpAddr,
    /// The link layer of the provider's port (what the kernel's CM does differs on
    /// InfiniBand, [`KernelCmConfig::link`]).
    pub link_layer: LinkLayer,
    /// Test fault: the TUN device takes at most this many packets a second, the rest wait
    /// in the endpoint's queue (`--fault-tun-rate`); `None`: as fast as it takes them.
    pub tun_write_rate: Option<NonZeroU32>,
}

/// Why a [`Node`] could not be set up. Its `Display` names the step.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The CM MAD side channel's socket could not be bound.
    #[error("MAD side channel {addr}: {source}")]
    MadBind {
        /// The address it was to bind.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// QP1 or the endpoint's QPs, CQs and buffers could not be set up on the provider.
    #[error("provider set-up: {0}")]
    Provider(#[source] VerbsError),
    /// The kernel's CM could not be opened (no `/dev/infiniband/rdma_cm`, or the listener
    /// could not bind).
    #[error("--cm-transport rdmacm on {addr}: {message}")]
    RdmaCm {
        /// The address and port it was to listen on.
        addr: SocketAddr,
        /// Why, one line.
        message: String,
    },
    /// The TUN device could not be created.
    #[error("TUN device: {0}")]
    Tun(#[source] io::Error),
    /// The interface MTU could not be set.
    #[error("interface MTU: {0}")]
    InterfaceMtu(#[source] io::Error),
    /// An interface address could not be added.
    #[error("interface address {addr}/{prefix_len}: {source}")]
    Addr {
        /// The address.
        addr: IpAddr,
        /// Its prefix length.
        prefix_len: u8,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The interface could not be brought up.
    #[error("interface up: {0}")]
    InterfaceUp(#[source] io::Error),
    /// A descriptor could not be registered with the event loop.
    #[error("event loop registration: {0}")]
    Register(#[source] io::Error),
    /// [`Node::new`] cannot open this transport: the caller opens it
    /// ([`Node::with_transport`]).
    #[error("CM transport {0:?}: opened by the caller (Node::with_transport)")]
    TransportNeedsCaller(CmTransport),
}

/// The node's descriptors that are not the provider's.
#[derive(Debug, Clone, Copy)]
struct Tokens {
    tun: Token,
    /// The MAD transport's own descriptor's, when it has one.
    mad: Option<Token>,
    /// The kernel CM's event channel, with [`CmTransport::RdmaCm`].
    kcm: Option<Token>,
    /// One past the last of the node's tokens.
    end: Token,
}

/// One IPoIB interface: a TUN device and an [`Endpoint`] over a provider `P`, with the CM MAD
/// transport the configuration names. See the [module documentation](super) for the calling
/// protocol.
pub struct Node<P: Provider> {
    prov: P,
    sources: ProviderSources,
    ep: Endpoint,
    mad: Box<dyn MadTransport<P::Verbs>>,
    /// The kernel's CM, with [`CmTransport::RdmaCm`].
    kcm: Option<KernelCmDriver>,
    /// The other workers' kernel CM inputs ([`Node::route_kcm`]).
    kcm_route: Option<KcmRoute>,
    cm_transport: CmTransport,
    /// Reused between turns by [`mad::receive`].
    mads: Vec<Mad>,
    tun: Tun,
    tokens: Tokens,
    /// The TUN device reported readability that has not been read to exhaustion since (or a
    /// TUN write may have produced a local reply): read it this turn.
    tun_ready: bool,
    /// The per-kind budgets of the event log lines.
    event_log: EventLog,
    /// The last turn stopped reading the TUN at [`TUN_BATCH`]: the next turn comes at once.
    tun_more: bool,
    /// Packets written to the TUN device, and those it refused.
    tun_stats: TunStats,
    /// [`NodeConfig::tun_write_rate`].
    tun_throttle: Option<TunThrottle>,
    /// Where a TUN packet is read while shutting down with no send buffer free.
    drain_buf: Vec<u8>,
    /// Set by [`Node::begin_shutdown`]: when the drain gives up.
    stop_deadline: Option<Instant>,
    /// The TUN device said its interface is gone (deleted under the daemon): it is read no
    /// more.
    interface_removed: bool,
    /// The SA client of a native InfiniBand port ([`Node::attach_sa`]).
    sa: Option<SaDriver>,
    /// The interface MTU set on the TUN device (the broadcast group's record may lower it in
    /// datagram mode).
    tun_mtu: u32,
    /// The interface was up when last looked at ([`Node::check_interface`]).
    tun_up: bool,
    /// The port became active since [`Node::take_port_active`]: its MTU may have changed.
    port_active: bool,
    /// The provider's first token (its descriptors are registered again after a reopen).
    first_token: usize,
    /// How many descriptors the provider had at the start (a reopened one must have as many).
    source_count: usize,
    /// The device context is lost: when to try opening it again.
    down: Option<ReopenBackoff>,
    /// Why the node stopped trying to reopen its device (the daemon exits with it).
    gave_up: Option<String>,
    device_stats: DeviceStats,
}

impl<P: Provider> std::fmt::Debug for Node<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("ifname", &self.tun.name())
            .field("hwaddr", &self.ep.hwaddr())
            .field("tokens", &self.tokens)
            .field("stop_deadline", &self.stop_deadline)
            .finish_non_exhaustive()
    }
}

impl<P: Provider> Node<P> {
    /// Hands the endpoint's multicast groups and paths to `sa`, the SA client of the
    /// provider's InfiniBand port, registered on the token [`Node::tokens_end`] had (which
    /// moves one on). Call it right after [`Node::new`].
    pub fn attach_sa(&mut self, now: Instant, mut sa: SaDriver, registry: &Registry) {
        let token = self.tokens.end;
        self.tokens.end = Token(token.0 + 1);
        sa.register(registry, token);
        self.ep.use_sa_groups(self.prov.verbs());
        self.sa = Some(sa);
        self.pump_sa(now);
    }

    /// The SA client, where one runs.
    #[must_use]
    pub fn sa(&self) -> Option<&SaDriver> {
        self.sa.as_ref()
    }

    /// Runs the SA client's turn, sends the MADs of what waited for the paths it answered,
    /// then sets the interface MTU the broadcast group's record gave (datagram mode).
    fn pump_sa(&mut self, now: Instant) {
        let Some(sa) = &mut self.sa else {
            return;
        };
        let mut lids = Vec::new();
        sa.pump(now, &mut self.ep, self.prov.verbs(), |ev| {
            tracing::info!(target: "ipoib_cm::sa", "{ev:?}");
            if let SaEvent::PathResolved { dgid, path } = ev {
                lids.push((*dgid, path.dlid));
            }
        });
        // A CM on the kernel's QP1 (umad) addresses its MADs by the peers' LIDs; then the REQs
        // of connections that waited for these paths leave.
        for (gid, lid) in lids {
            self.mad.set_peer_lid(gid, lid);
        }
        self.send_mads(now);
        self.sync_tun_mtu("the broadcast group");
    }

    /// One past the last token the node registered: the tokens `first_token..tokens_end()`
    /// are the node's.
    #[must_use]
    pub fn tokens_end(&self) -> Token {
        self.tokens.end
    }

    /// Readiness was reported on `token`: returns whether the token is one of the node's (the
    /// caller handles the others). Call it for every event before [`Node::turn`].
    pub fn note_readiness(&mut self, token: Token) -> bool {
        if let Some(i) = self.sources.index_of(token) {
            self.prov.note_readiness(i);
            return true;
        }
        if token == self.tokens.tun {
            self.tun_ready = true;
            return true;
        }
        if self.sa.as_ref().is_some_and(|s| s.note_readiness(token)) {
            return true;
        }
        // The MAD transport is read on every turn (QP1 has no readiness of its own), so the
        // readiness of its own descriptor only needs to wake the loop; so does the kernel
        // CM's channel.
        self.tokens.mad == Some(token) || self.tokens.kcm == Some(token)
    }

    /// When the next turn is due even without readiness: the earliest deadline of the
    /// provider, the endpoint and the shutdown bound.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if let Some(b) = &self.down {
            // Nothing but the reopen, the shutdown bound and the log windows runs meanwhile.
            return [
                Some(b.next_at()),
                self.stop_deadline,
                self.event_log.poll_timeout(),
            ]
            .into_iter()
            .flatten()
            .min();
        }
        [
            self.prov.poll_timeout(),
            self.ep.poll_timeout(),
            self.stop_deadline,
            self.sa.as_ref().and_then(SaDriver::poll_timeout),
            self.event_log.poll_timeout(),
            self.tun_throttle
                .filter(|_| self.ep.has_tun_packets())
                .map(|t| t.next_at()),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// True when the last turn left packets in the TUN device's queue or MADs in the
    /// transport's (it read its bound of them): the next turn should follow at once, without
    /// sleeping.
    #[must_use]
    pub fn has_pending_input(&self) -> bool {
        if self.down.is_some() {
            return self.tun_more;
        }
        self.tun_more
            || self.mad.has_more()
            || self.kcm.as_ref().is_some_and(KernelCmDriver::has_pending)
    }

    /// The receive half of a turn: everything that arrived is read and handled, and the
    /// endpoint's timers run; what that queued on the provider leaves at [`Node::flush`].
    ///
    /// # Errors
    /// A fatal I/O error of the provider or the TUN device.
    pub fn turn(&mut self, now: Instant) -> io::Result<()> {
        if self.down.is_some() {
            self.turn_down(now);
            return Ok(());
        }
        // Read, pass what arrived on to the TUN, then read the TUN (a local reply to what was
        // just written may already be there), and transmit once at the end: the ACKs of what
        // was read leave with the replies, after the data was delivered.
        let read = self.prov.handle_input(now)?;
        if read >= EARLY_ACK_BATCH {
            // A large batch takes a while to pass on to the TUN: acknowledge it first, so
            // that the peer's send queue drains meanwhile (a single request still has its ACK
            // leave after the reply, below).
            self.prov.flush(now)?;
        }
        self.receive_mads(now);
        self.ep.handle_verbs(now, self.prov.verbs());
        if self.take_device_events(now) {
            self.log_events(now);
            return Ok(());
        }
        self.send_mads(now);
        self.write_tun(now);
        if (self.tun_ready || self.tun_more) && !self.interface_removed {
            self.read_tun(now)?;
        }
        self.ep.handle_timeout(now, self.prov.verbs());
        self.send_mads(now);
        // After the TUN reads: a send-only join asked for by a packet leaves this turn.
        self.pump_sa(now);
        self.write_tun(now);
        self.log_events(now);
        Ok(())
    }

    /// Logs the endpoint's connection events, one info line each, at most
    /// [`EVENT_QUEUE_CAP`] per call (the queue holds no more) and
    /// [`EVENT_LINES_PER_WINDOW`](super::event_log::EVENT_LINES_PER_WINDOW) per kind per
    /// [`EVENT_LOG_WINDOW`](super::event_log::EVENT_LOG_WINDOW); what a kind had beyond that
    /// is one line with its count when its window ends.
    fn log_events(&mut self, now: Instant) {
        let suppressed = |what: &str, n: u64| {
            tracing::info!(
                target: "ipoib_cm::event",
                "{what}: {n} more not logged in the last {:?}",
                super::event_log::EVENT_LOG_WINDOW
            );
        };
        self.event_log.roll(now, suppressed);
        for _ in 0..EVENT_QUEUE_CAP {
            let Some(e) = self.ep.poll_event() else {
                break;
            };
            if self.event_log.admit(now, e.what(), suppressed) == Verdict::Log {
                tracing::info!(target: "ipoib_cm::event", "{e}");
            }
        }
    }

    /// The end of a turn: transmits what the turn (and a [`Node::begin_shutdown`] after it)
    /// queued on the provider, and re-registers the provider's descriptors whose wanted
    /// interest changed.
    ///
    /// # Errors
    /// A fatal I/O error of the provider, or the registry's.
    pub fn flush(&mut self, now: Instant, registry: &Registry) -> io::Result<()> {
        if self.down.is_some() {
            self.try_reopen(now, registry);
            if self.down.is_some() {
                return Ok(());
            }
        }
        self.prov.flush(now)?;
        self.sources.sync(registry, &self.prov)
    }

    /// The device context is lost and not open again yet: packets for peers are dropped.
    #[must_use]
    pub fn device_down(&self) -> bool {
        self.down.is_some()
    }

    /// Why the node gave up reopening its lost device ([`REOPEN_MAX_FAILURES`] tries failed
    /// in a row, or a CM transport that cannot follow a reopen): the caller exits with it.
    #[must_use]
    pub fn device_gave_up(&self) -> Option<&str> {
        self.gave_up.as_deref()
    }

    /// What the node counted of its device: fatal events, reopens, drops while down.
    #[must_use]
    pub fn device_stats(&self) -> DeviceStats {
        self.device_stats
    }

    /// Starts an orderly shutdown: no new connections, a DREQ for every one, and from now on
    /// TUN packets are read even without a free send buffer (to be dropped or queued). The
    /// drain is bounded by the endpoint's `drain_timeout` from `now`. Calling it again does
    /// nothing.
    pub fn begin_shutdown(&mut self, now: Instant) {
        if self.stop_deadline.is_some() {
            return;
        }
        if self.down.is_some() {
            // No connection is left to close, nor a device to close them on.
            self.stop_deadline = Some(now);
            return;
        }
        self.ep.begin_shutdown(now, self.prov.verbs());
        self.send_mads(now);
        if self.sa.is_some() {
            // The SA leaves go out now, to be answered within the drain bound.
            self.ep.leave_groups(self.prov.verbs());
            self.pump_sa(now);
        }
        self.log_events(now);
        self.stop_deadline = Some(now + self.ep.config().drain_timeout);
    }

    /// True after [`Node::begin_shutdown`].
    #[must_use]
    pub fn is_shutting_down(&self) -> bool {
        self.stop_deadline.is_some()
    }

    /// True once every connection is gone after [`Node::begin_shutdown`].
    #[must_use]
    pub fn is_stopped(&self) -> bool {
        self.ep.is_stopped()
    }

    /// True when a shutdown is over at `now`: every connection is gone, or the drain bound
    /// has passed. Then call [`Node::finish`].
    #[must_use]
    pub fn should_finish(&self, now: Instant) -> bool {
        let sa_idle = self.sa.as_ref().is_none_or(SaDriver::is_idle);
        self.stop_deadline
            .is_some_and(|deadline| (self.ep.is_stopped() && sa_idle) || now >= deadline)
    }

    /// Ends the node: [`Node::wind_up`], then removes the interface (by closing the TUN
    /// device).
    ///
    /// # Errors
    /// A fatal I/O error of the provider.
    pub fn finish(mut self, now: Instant) -> io::Result<()> {
        self.wind_up(now)
    }

    /// Destroys whatever connection is left, leaves the multicast groups and lets the last
    /// DREQs and DREPs out; the interface stays until the node is dropped (its counters can
    /// still be read).
    ///
    /// # Errors
    /// A fatal I/O error of the provider.
    pub fn wind_up(&mut self, now: Instant) -> io::Result<()> {
        if self.down.is_some() {
            // The lost context goes with the provider.
            self.log_events(now);
            return Ok(());
        }
        if !self.ep.is_stopped() {
            self.ep.force_stop(self.prov.verbs());
        }
        self.ep.leave_groups(self.prov.verbs());
        self.receive_mads(now);
        self.ep.handle_verbs(now, self.prov.verbs());
        self.send_mads(now);
        self.prov.handle_io(now)?;
        self.log_events(now);
        Ok(())
    }

    /// True once the TUN device reported its interface deleted (`ip link del`): the daemon
    /// should shut down, as nothing reaches it any more.
    #[must_use]
    pub fn interface_removed(&self) -> bool {
        self.interface_removed
    }

    /// An IP packet a follower worker handed to control (worker 0) to send: handled as one
    /// read from the TUN device.
    pub fn hand_in(&mut self, now: Instant, packet: &[u8]) {
        if self.down.is_some() {
            return;
        }
        self.ep.handle_tun_packet(now, self.prov.verbs(), packet);
    }

    /// The endpoint, to change its live settings (see [`crate::ipoib::LiveTimeouts`]).
    pub fn endpoint_mut(&mut self) -> &mut Endpoint {
        &mut self.ep
    }

    /// The provider, to change its live settings.
    pub fn provider_mut(&mut self) -> &mut P {
        &mut self.prov
    }

    /// Runs `change` on the endpoint and the provider's verbs (a live setting such as
    /// [`Endpoint::add_static_neighbour`]), then lets the CM act on it; what that sends
    /// leaves at [`Node::flush`].
    pub fn reconfigure<R>(
        &mut self,
        now: Instant,
        change: impl FnOnce(&mut Endpoint, &mut P::Verbs) -> R,
    ) -> R {
        let r = change(&mut self.ep, self.prov.verbs());
        self.ep.handle_timeout(now, self.prov.verbs());
        self.send_mads(now);
        r
    }

    /// The interface name the kernel gave.
    #[must_use]
    pub fn ifname(&self) -> &str {
        self.tun.name()
    }

    /// The endpoint (its snapshot, counters and configuration).
    #[must_use]
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// The provider (its counters).
    #[must_use]
    pub fn provider(&self) -> &P {
        &self.prov
    }

    /// The CM MAD transport's counters.
    #[must_use]
    pub fn mad_stats(&self) -> MadStats {
        self.mad.stats()
    }

    /// Packets the TUN device refused (its queue was full, or the write failed).
    #[must_use]
    pub fn tun_write_drops(&self) -> u64 {
        self.tun_stats.write_drops
    }

    /// Packets written to the TUN device, their bytes, and those it refused.
    #[must_use]
    pub fn tun_stats(&self) -> TunStats {
        self.tun_stats
    }

    /// How the CM's messages travel.
    #[must_use]
    pub fn cm_transport(&self) -> CmTransport {
        self.cm_transport
    }

    /// The counters of the kernel CM's driver side, with [`CmTransport::RdmaCm`].
    #[must_use]
    pub fn kcm_stats(&self) -> Option<KcmStats> {
        self.kcm.as_ref().map(KernelCmDriver::stats)
    }

    /// The kernel's CM ids of the other workers run on this node's event channel: what it
    /// reads for them goes to `route` (their ids carry their index in the low bits).
    pub fn route_kcm(&mut self, route: KcmRoute) {
        if let Some(k) = &mut self.kcm {
            k.set_workers(route.count);
        }
        self.kcm_route = Some(route);
    }

    /// Executes a command of another worker's kernel CM on this node's event channel.
    pub fn execute_kcm(&mut self, now: Instant, c: crate::cm::KcmCommand) {
        if let Some(k) = &mut self.kcm {
            let mut sink = KcmRouter {
                ep: &mut self.ep,
                route: self.kcm_route.as_mut(),
            };
            k.execute_one(now, &mut sink, c);
        }
    }

    /// Hands every MAD the transport received (or what the kernel's CM read) to the endpoint.
    fn receive_mads(&mut self, now: Instant) {
        if let Some(k) = &mut self.kcm {
            let mut sink = KcmRouter {
                ep: &mut self.ep,
                route: self.kcm_route.as_mut(),
            };
            k.receive(now, &mut sink);
        }
        let ep = &mut self.ep;
        mad::receive(
            self.mad.as_mut(),
            self.prov.verbs(),
            &mut self.mads,
            |from, route, m| {
                ep.handle_routed_mad(now, from, route, m);
            },
        );
    }

    /// Sends the endpoint's MADs while the transport has room (or executes what it asked of
    /// the kernel's CM).
    fn send_mads(&mut self, now: Instant) {
        if let Some(k) = &mut self.kcm {
            k.execute(now, &mut self.ep);
        }
        let ep = &mut self.ep;
        mad::send_while_room(self.mad.as_mut(), self.prov.verbs(), || ep.poll_mad());
    }

    /// Writes what the endpoint delivered to the TUN device; a write may bring a local reply,
    /// so the TUN device is read again after any.
    fn write_tun(&mut self, now: Instant) {
        let max = self
            .tun_throttle
            .as_mut()
            .map_or(usize::MAX, |t| t.budget(now));
        let (taken, wrote) = write_tun(
            &self.tun,
            &mut self.ep,
            self.prov.verbs(),
            max,
            &mut self.tun_stats,
        );
        if let Some(t) = &mut self.tun_throttle {
            t.spend(taken);
        }
        if wrote {
            self.tun_ready = true;
        }
    }

    /// Reads up to [`TUN_BATCH`] packets from the TUN device into the endpoint.
    fn read_tun(&mut self, now: Instant) -> io::Result<()> {
        self.tun_more = false;
        let draining = self.stop_deadline.is_some();
        for i in 0..TUN_BATCH {
            let read = read_tun(
                &self.tun,
                &mut self.ep,
                self.prov.verbs(),
                now,
                &mut self.drain_buf,
                draining,
            );
            let read = match read {
                Err(e) if is_interface_gone(&e) => {
                    self.interface_removed = true;
                    self.tun_ready = false;
                    return Ok(());
                }
                r => r?,
            };
            match read {
                TunRead::Packet => {}
                TunRead::Empty => {
                    // Edge-triggered: the next packet brings an event.
                    self.tun_ready = false;
                    break;
                }
                // Every send buffer is in flight: leave the packets in the TUN queue
                // (tun_ready stays set) until completions free some; reading them only to
                // drop them cost a read each while the sender outran the fabric.
                TunRead::NoSendBuffer => break,
            }
            if i + 1 == TUN_BATCH {
                self.tun_more = true;
            }
        }
        Ok(())
    }
}
