//! `ipoib-cm up`: the mio event loop that bridges the TUN device and the provider through the
//! [`Endpoint`].
//!
//! One clock read per turn; every source is drained until it would block (each bounded per
//! turn so none starves the others); the loop sleeps until the earliest deadline of the
//! provider and the endpoint. SIGINT/SIGTERM start an orderly shutdown: stop accepting, DREQ
//! everything, drain with the `drain_timeout` bound, destroy what is left, remove the
//! interface (by closing the TUN device) and return.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

use super::config::{CmTransport, Config, Mode as CfgMode, QpBudgetPolicy as CfgPolicy};
use super::control::ControlServer;
use super::status::{
    Counters as StatusCounters, InterfaceStatus, NeighbourState, NeighbourStatus, RxState,
    RxStatus, Status, TxState, TxStatus,
};
use crate::ipoib::{self, Endpoint, EndpointConfig, TUN_BUFFER_OFFSET};
use crate::mad::{self, Gsi, Mad, MadStats, MadTransport, MadUdp};
use crate::soft::provider::{SoftProvider, UdpOffload};
use crate::soft::{SoftConfig, SoftVerbs};
use crate::sys::{ifaddr, tun::Tun};
use crate::verbs::{Provider, Verbs};

const PROVIDER: usize = 0;
const TUN: Token = Token(100);
const CONTROL: Token = Token(101);
const SIGNALS: Token = Token(102);
const MAD: Token = Token(103);

/// Packets read from the TUN device per turn.
const TUN_BATCH: usize = 256;
/// Longest sleep when nothing is scheduled.
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// Packets read in one turn from which their acknowledgements leave before the TUN writes.
const EARLY_ACK_BATCH: usize = 8;

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Setting something up failed (names what).
    #[error("{0}")]
    Setup(String),
    /// The event loop failed.
    #[error("event loop: {0}")]
    Io(#[from] io::Error),
}

fn setup(what: &str) -> impl Fn(String) -> DaemonError + '_ {
    move |e| DaemonError::Setup(format!("{what}: {e}"))
}

/// Maps the daemon configuration onto the endpoint's.
fn endpoint_config(cfg: &Config, path_mtu: crate::verbs::PathMtu, seed: u64) -> EndpointConfig {
    let mut e = EndpointConfig::new(cfg.addr.iter().map(|c| (c.addr, c.prefix_len)).collect());
    e.mode = match cfg.mode {
        CfgMode::Connected => ipoib::Mode::Connected,
        CfgMode::Datagram => ipoib::Mode::Datagram,
    };
    e.srq = cfg.srq;
    e.rx_timeout = cfg.rx_timeout;
    e.drain_timeout = cfg.drain_timeout;
    e.tx_stall_timeout = cfg.tx_stall_timeout;
    e.neigh_timeout = cfg.neigh_timeout;
    e.max_conn_qp = cfg.max_conn_qp as usize;
    e.budget_policy = match cfg.qp_budget_policy {
        CfgPolicy::Evict => ipoib::QpBudgetPolicy::Evict,
        CfgPolicy::Reject => ipoib::QpBudgetPolicy::Reject,
    };
    e.tx_queue_len = cfg.tx_queue_len as usize;
    e.static_neighbours = cfg.neigh.clone();
    e.qp_timeout = cfg.qp_timeout;
    e.path_mtu = path_mtu;
    e.seed = seed;
    e
}

/// Entropy for PSNs and CM ids: the clock and the pid (nothing here needs to be secret, only
/// different across restarts).
fn seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    t ^ (u64::from(std::process::id()) << 32)
}

/// What the driver needs of a provider beyond [`Provider`]: its counters for the status.
pub trait DaemonProvider: Provider {
    /// Live QPs as the provider counts them, where it does.
    fn qp_live(&self) -> Option<u64>;
    /// Adds the provider's own counters to the status map.
    fn counters(&self, out: &mut BTreeMap<String, u64>);
}

impl DaemonProvider for SoftProvider {
    fn qp_live(&self) -> Option<u64> {
        Some(self.engine().qp_count() as u64)
    }

    fn counters(&self, out: &mut BTreeMap<String, u64>) {
        let engine: &SoftVerbs = self.engine();
        let s = engine.stats();
        for (k, v) in [
            ("rx_datagrams", s.rx_datagrams),
            ("rx_malformed", s.rx_malformed),
            ("rx_bad_icrc", s.rx_bad_icrc),
            ("rx_bad_pkey", s.rx_bad_pkey),
            ("rx_unknown_qpn", s.rx_unknown_qpn),
            ("rx_bad_src", s.rx_bad_src),
            ("rx_bad_qkey", s.rx_bad_qkey),
            ("rx_bad_state", s.rx_bad_state),
            ("tx_packets", s.tx_packets),
            ("tx_retransmits", s.tx_retransmits),
            ("retransmit_timeouts", s.retransmit_timeouts),
            ("rx_rnr_naks", s.rx_rnr_naks),
            ("tx_rnr_naks", s.tx_rnr_naks),
            ("rx_seq_naks", s.rx_seq_naks),
            ("tx_seq_naks", s.tx_seq_naks),
            ("rx_out_of_sequence", s.rx_out_of_sequence),
            ("send_errors", self.send_errors),
            ("udp_gso", u64::from(self.gso_enabled())),
            ("rx_gso_segments", s.rx_gso_segments),
            ("rx_gro_buffers", self.rx_gro_buffers),
            ("tx_gso_trains", self.tx_gso_trains()),
            ("fault_dropped", s.faults.dropped),
            ("fault_duplicated", s.faults.duplicated),
            ("fault_reordered", s.faults.reordered),
            ("fault_corrupted", s.faults.corrupted),
        ] {
            out.insert(k.to_string(), v);
        }
    }
}

#[cfg(feature = "verbs")]
impl DaemonProvider for crate::hw::HwVerbs {
    fn qp_live(&self) -> Option<u64> {
        Some(self.qp_count() as u64)
    }

    fn counters(&self, out: &mut BTreeMap<String, u64>) {
        let s = self.stats();
        for (k, v) in [
            ("hw_completions", s.completions),
            ("hw_completion_errors", s.completion_errors),
            ("hw_async_events", s.async_events),
            ("hw_async_unhandled", s.async_unhandled),
        ] {
            out.insert(k.to_string(), v);
        }
    }
}

/// The underlay link MTU of `--bind` and the path MTU to use.
fn path_mtu(cfg: &Config) -> Result<crate::verbs::PathMtu, DaemonError> {
    let link_mtu = ifaddr::link_mtu_for(cfg.bind);
    if link_mtu.is_none() {
        return Err(DaemonError::Setup(format!(
            "--bind {}: no local interface has this address",
            cfg.bind
        )));
    }
    Ok(cfg.effective_path_mtu(link_mtu))
}

/// Runs the daemon on the software provider until SIGINT or SIGTERM. CM MADs travel over QP1
/// unless `cm_transport` says UDP.
///
/// # Errors
/// A set-up step that failed (one line naming it), or a fatal event-loop error.
pub fn up(cfg: &Config) -> Result<(), DaemonError> {
    let path_mtu = path_mtu(cfg)?;
    let mut soft = SoftConfig::new(cfg.bind);
    soft.src_port = cfg.udp_port;
    soft.dst_port = cfg.udp_port;
    soft.port_mtu = path_mtu;
    soft.verify_icrc_v4 = cfg.verify_icrc_v4;
    soft.faults = cfg.fault;
    soft.quirks = cfg.quirks;
    let offload = if cfg.udp_offload {
        UdpOffload::On
    } else {
        UdpOffload::Off
    };
    let mut prov = SoftProvider::bind(soft, offload)
        .map_err(|e| DaemonError::Setup(format!("--bind {}:{}: {e}", cfg.bind, cfg.udp_port)))?;
    prov.verbs().set_mcast_peers(cfg.peer.clone());
    run(
        cfg,
        prov,
        path_mtu,
        cfg.cm_transport.unwrap_or(CmTransport::Qp1),
    )
}

/// Runs the daemon on libibverbs (`--provider verbs`) until SIGINT or SIGTERM. CM MADs travel
/// over the UDP side channel unless `cm_transport` says QP1 (which the kernel owns: set-up
/// fails).
///
/// # Errors
/// A set-up step that failed (one line naming it), or a fatal event-loop error.
#[cfg(feature = "verbs")]
pub fn up_verbs(cfg: &Config, hw: &crate::hw::HwConfig) -> Result<(), DaemonError> {
    let path_mtu = path_mtu(cfg)?;
    let mut hw = hw.clone();
    hw.local_ip = hw.local_ip.or(Some(cfg.bind));
    let prov = crate::hw::HwVerbs::open(&hw)
        .map_err(|e| DaemonError::Setup(format!("--provider verbs: {e}")))?;
    run(
        cfg,
        prov,
        path_mtu,
        cfg.cm_transport.unwrap_or(CmTransport::Udp),
    )
}

/// The event loop over any provider.
fn run<P: DaemonProvider>(
    cfg: &Config,
    mut prov: P,
    path_mtu: crate::verbs::PathMtu,
    transport: CmTransport,
) -> Result<(), DaemonError> {
    let mut poll = Poll::new()?;
    let mut mad: Box<dyn MadTransport<P::Verbs>> = match transport {
        CmTransport::Qp1 => Box::new(
            Gsi::open_for_cm(prov.verbs())
                .map_err(|e| DaemonError::Setup(format!("provider set-up: {e}")))?,
        ),
        CmTransport::Udp => {
            let mut u = MadUdp::bind(cfg.bind, cfg.mad_port).map_err(|e| {
                DaemonError::Setup(format!("--mad-port {}:{}: {e}", cfg.bind, cfg.mad_port))
            })?;
            poll.registry()
                .register(u.socket_mut(), MAD, Interest::READABLE)?;
            Box::new(u)
        }
    };
    let mut mads: Vec<Mad> = Vec::new();

    let start = Instant::now();
    let ep_cfg = endpoint_config(cfg, path_mtu, seed());
    let mtu = ep_cfg.interface_mtu();
    let mut ep = Endpoint::new(start, prov.verbs(), ep_cfg, mad.provider_qp())
        .map_err(|e| DaemonError::Setup(format!("provider set-up: {e}")))?;

    let mut tun = Tun::create(&cfg.ifname).map_err(|e| setup("--ifname")(e.to_string()))?;
    tun.set_mtu(mtu)
        .map_err(|e| setup("interface MTU")(e.to_string()))?;
    for c in &cfg.addr {
        let r = match c.addr {
            IpAddr::V4(a) => tun.add_ipv4(a, c.prefix_len),
            IpAddr::V6(a) => tun.add_ipv6(a, c.prefix_len),
        };
        r.map_err(|e| DaemonError::Setup(format!("--addr {c}: {e}")))?;
    }
    tun.set_up()
        .map_err(|e| setup("interface up")(e.to_string()))?;

    let mut control = ControlServer::bind(&cfg.control_socket).map_err(|e| {
        DaemonError::Setup(format!(
            "--control-socket {}: {e}",
            cfg.control_socket.display()
        ))
    })?;
    let mut signals = Signals::new([SIGINT, SIGTERM])?;

    prov.register(poll.registry(), PROVIDER)?;
    poll.registry()
        .register(&mut tun, TUN, Interest::READABLE)?;
    poll.registry()
        .register(&mut control, CONTROL, Interest::READABLE)?;
    poll.registry()
        .register(&mut signals, SIGNALS, Interest::READABLE)?;
    tracing::info!(
        ifname = tun.name(),
        hwaddr = %ep.hwaddr(),
        mtu,
        path_mtu = path_mtu.bytes(),
        "interface up"
    );

    let mut events = Events::with_capacity(256);
    let mut buf = vec![0u8; 65_536];
    let mut tun_more = false;
    let mut tun_ready = true;
    let mut last_event = Instant::now();
    let mut stop_deadline: Option<Instant> = None;
    let mut tun_write_drops = 0u64;
    loop {
        let now = Instant::now();
        let next = [prov.poll_timeout(), ep.poll_timeout(), stop_deadline]
            .into_iter()
            .flatten()
            .min();
        // Busy polling: for `busy_poll` after the last event, look for events without
        // sleeping, so a packet arriving then costs no wakeup.
        let spinning = now < last_event + cfg.busy_poll;
        let timeout = if tun_more || spinning {
            Duration::ZERO
        } else {
            next.map_or(IDLE_WAKE, |t| t.saturating_duration_since(now))
                .min(IDLE_WAKE)
        };
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
        let now = Instant::now();
        if events.is_empty() && spinning && !tun_more && next.is_none_or(|t| t > now) {
            // Nothing arrived and nothing is due: spin on, letting any other runnable task
            // on this CPU go first (spinning must not starve the processes we carry
            // packets for).
            std::thread::yield_now();
            continue;
        }
        if !events.is_empty() {
            last_event = now;
        }
        let mut control_ready = false;
        let mut signalled = false;
        for ev in events.iter() {
            match ev.token() {
                CONTROL => control_ready = true,
                SIGNALS => signalled = true,
                TUN => tun_ready = true,
                // The MAD transport is read on every turn (QP1 has no readiness of its own),
                // so the side channel's readiness only needs to wake the loop.
                MAD => {}
                t => prov.note_readiness(t),
            }
        }
        // Read, pass what arrived on to the TUN, then read the TUN (a local reply to what was
        // just written may already be there), and transmit once at the end: the ACKs of what
        // was read leave with the replies, after the data was delivered.
        let read = prov.handle_input(now)?;
        if read >= EARLY_ACK_BATCH {
            // A large batch takes a while to pass on to the TUN: acknowledge it first, so
            // that the peer's send queue drains meanwhile (a single request still has its ACK
            // leave after the reply, below).
            prov.flush(now)?;
        }
        mad::receive(mad.as_mut(), prov.verbs(), &mut mads, |from, m| {
            ep.handle_mad(now, from, m);
        });
        ep.handle_verbs(now, prov.verbs());
        mad::send_while_room(mad.as_mut(), prov.verbs(), || ep.poll_mad());
        if write_tun(&tun, &mut ep, prov.verbs(), &mut tun_write_drops) {
            tun_ready = true;
        }
        if tun_ready || tun_more {
            tun_more = false;
            let draining = stop_deadline.is_some();
            for i in 0..TUN_BATCH {
                match read_tun(&tun, &mut ep, prov.verbs(), now, &mut buf, draining)? {
                    TunRead::Packet => {}
                    TunRead::Empty => {
                        // Edge-triggered: the next packet brings an event.
                        tun_ready = false;
                        break;
                    }
                    // Every send buffer is in flight: leave the packets in the TUN queue
                    // (tun_ready stays set) until completions free some; reading them only to
                    // drop them cost a read each while the sender outran the fabric.
                    TunRead::NoSendBuffer => break,
                }
                if i + 1 == TUN_BATCH {
                    tun_more = true;
                }
            }
        }
        ep.handle_timeout(now, prov.verbs());
        mad::send_while_room(mad.as_mut(), prov.verbs(), || ep.poll_mad());
        if write_tun(&tun, &mut ep, prov.verbs(), &mut tun_write_drops) {
            tun_ready = true;
        }
        if control_ready {
            let name = tun.name().to_string();
            let mad_stats = mad.stats();
            control.accept_and_serve(|| status(&name, &ep, mad_stats, &prov, now, tun_write_drops));
        }
        if signalled {
            for sig in signals.pending() {
                tracing::info!(signal = sig, "shutting down");
            }
            if stop_deadline.is_none() {
                ep.begin_shutdown(now, prov.verbs());
                mad::send_while_room(mad.as_mut(), prov.verbs(), || ep.poll_mad());
                stop_deadline = Some(now + cfg.drain_timeout);
            }
        }
        prov.flush(now)?;
        if let Some(deadline) = stop_deadline {
            if ep.is_stopped() || now >= deadline {
                if !ep.is_stopped() {
                    ep.force_stop(prov.verbs());
                }
                // Let the last DREQs and DREPs out.
                mad::receive(mad.as_mut(), prov.verbs(), &mut mads, |from, m| {
                    ep.handle_mad(now, from, m);
                });
                ep.handle_verbs(now, prov.verbs());
                mad::send_while_room(mad.as_mut(), prov.verbs(), || ep.poll_mad());
                prov.handle_io(now)?;
                tracing::info!(counters = ?ep.counters(), "stopped");
                return Ok(());
            }
        }
    }
}

/// What [`read_tun`] did.
enum TunRead {
    /// Read and handled a packet.
    Packet,
    /// Nothing was waiting.
    Empty,
    /// Read nothing: no send buffer is free.
    NoSendBuffer,
}

/// Reads one packet from the TUN device into one of the endpoint's send buffers (a packet for
/// an established connection then leaves from there) and hands it over. With none free,
/// reads nothing, unless `draining` (shutting down: the packet is read into `buf` and handed
/// over, to be dropped or queued as the endpoint sees fit).
fn read_tun<V: Verbs>(
    tun: &Tun,
    ep: &mut Endpoint,
    v: &mut V,
    now: Instant,
    buf: &mut [u8],
    draining: bool,
) -> io::Result<TunRead> {
    let Some(b) = ep.tun_buffer() else {
        if !draining {
            return Ok(TunRead::NoSendBuffer);
        }
        let Some(n) = tun.recv(buf)? else {
            return Ok(TunRead::Empty);
        };
        ep.handle_tun_packet(now, v, buf.get(..n).unwrap_or_default());
        return Ok(TunRead::Packet);
    };
    let got = match v
        .pools_mut()
        .get_mut(b)
        .ok()
        .and_then(|room| room.get_mut(TUN_BUFFER_OFFSET..))
    {
        Some(room) => tun.recv(room),
        None => Ok(None),
    };
    match got {
        Ok(Some(n)) => {
            ep.handle_tun_buffer(now, v, b, n);
            Ok(TunRead::Packet)
        }
        Ok(None) => {
            ep.return_tun_buffer(b);
            Ok(TunRead::Empty)
        }
        Err(e) => {
            ep.return_tun_buffer(b);
            Err(e)
        }
    }
}

/// Writes the packets the endpoint delivered to the TUN device (straight from their receive
/// buffers); returns whether it wrote any.
fn write_tun<V: Verbs>(tun: &Tun, ep: &mut Endpoint, v: &mut V, drops: &mut u64) -> bool {
    let mut wrote = false;
    ep.drain_tun(v, |p| match tun.send(p) {
        Ok(true) => wrote = true,
        Ok(false) => *drops += 1,
        Err(e) => {
            *drops += 1;
            tracing::debug!(error = %e, "TUN write failed");
        }
    });
    wrote
}

/// The status snapshot served on the control socket.
fn status<P: DaemonProvider>(
    name: &str,
    ep: &Endpoint,
    mad: MadStats,
    prov: &P,
    now: Instant,
    tun_write_drops: u64,
) -> Status {
    let snap = ep.snapshot(now);
    let c = snap.counters;
    let counters = StatusCounters {
        qp_live: prov
            .qp_live()
            .unwrap_or(c.qp_created.saturating_sub(c.qp_destroyed)),
        qp_created: c.qp_created,
        qp_destroyed: c.qp_destroyed,
        rx_accepted: c.rx_accepted,
        rx_stale_reaped: c.rx_stale_reaped,
        rx_dreq_reaped: c.rx_dreq_reaped,
        rx_evicted: c.rx_evicted,
        drain_timeouts: c.drain_timeouts,
        last_wqe_events: c.last_wqe_events,
        tx_established: c.tx_established,
        tx_failed: c.tx_failed,
        tx_stalled: c.tx_stalled,
        tx_queue_drops: c.tx_queue_drops,
        icmp_too_big_sent: c.icmp_too_big_sent,
        rx_bad_packets: c.rx_bad_packets,
    };
    let cm = ep.cm_stats();
    let mut provider = BTreeMap::new();
    prov.counters(&mut provider);
    for (k, v) in [
        ("rx_packets", c.rx_packets),
        ("tx_ip_packets", c.tx_packets),
        ("tx_dropped", c.tx_dropped),
        ("rx_rejected", c.rx_rejected),
        ("neigh_conflicts", c.neigh_conflicts),
        ("neigh_failed", c.neigh_failed),
        ("tun_write_drops", tun_write_drops),
        ("cm_mads_received", cm.mads_received),
        ("cm_dropped_malformed", cm.dropped_malformed),
        ("cm_dropped_unknown", cm.dropped_unknown),
        ("cm_dropped_spoofed", cm.dropped_spoofed),
        ("cm_dropped_unexpected", cm.dropped_unexpected),
        ("cm_retransmits", cm.retransmits),
        ("cm_rej_sent", cm.rej_sent),
        ("cm_timeouts", cm.timeouts),
        ("mad_sent", mad.sent),
        ("mad_received", mad.received),
        ("mad_send_dropped", mad.send_dropped),
        ("mad_recv_malformed", mad.recv_malformed),
    ] {
        provider.insert(k.to_string(), v);
    }
    Status {
        interface: InterfaceStatus {
            name: name.to_string(),
            mtu: snap.mtu,
            mode: match snap.mode {
                ipoib::Mode::Connected => CfgMode::Connected,
                ipoib::Mode::Datagram => CfgMode::Datagram,
            },
            hwaddr: snap.hwaddr.to_string(),
        },
        neighbours: snap
            .neighbours
            .iter()
            .map(|(ip, hw, st)| NeighbourStatus {
                ip: *ip,
                hwaddr: hw.map(|h| h.to_string()).unwrap_or_default(),
                state: match st {
                    ipoib::NeighState::Incomplete { .. } => NeighbourState::Incomplete,
                    ipoib::NeighState::Reachable | ipoib::NeighState::Static => {
                        NeighbourState::Reachable
                    }
                },
            })
            .collect(),
        tx: snap
            .tx
            .iter()
            .map(|t| TxStatus {
                peer: t.peer.gid.to_string(),
                qpn: t.qpn.get(),
                state: match t.state {
                    ipoib::TxState::Connecting => TxState::Connecting,
                    ipoib::TxState::Established => TxState::Live,
                    ipoib::TxState::Closing => TxState::Closing,
                },
                mtu: t.mtu,
                queued: t.queued as u64,
                in_flight: u64::from(t.in_flight),
            })
            .collect(),
        rx: snap
            .rx
            .iter()
            .map(|(peer, qpn, st, idle)| RxStatus {
                peer: peer.to_string(),
                qpn: qpn.get(),
                state: match st {
                    ipoib::RxState::Live => RxState::Live,
                    ipoib::RxState::Error => RxState::Error,
                    ipoib::RxState::Flush => RxState::Flush,
                    ipoib::RxState::Drained => RxState::Drained,
                },
                idle_ms: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
            })
            .collect(),
        counters,
        provider,
    }
}
