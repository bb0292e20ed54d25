//! `ipoib-cm up`: the mio event loop that bridges the TUN device and the provider through the
//! [`Endpoint`].
//!
//! One clock read per turn; every source is drained until it would block (each bounded per
//! turn so none starves the others); the loop sleeps until the earliest deadline of the
//! provider, the endpoint and the control socket's clients. SIGINT/SIGTERM start an orderly
//! shutdown: stop accepting, DREQ everything, drain with the `drain_timeout` bound, destroy
//! what is left, remove the interface (by closing the TUN device) and return.

use std::collections::BTreeMap;
use std::io;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

use super::config::{CmTransport, Config};
use super::control::ControlServer;
use super::status::{add_counters, Status};
use crate::driver::ProviderSources;
use crate::ipoib::{Endpoint, TUN_BUFFER_OFFSET};
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
/// The first of the control clients' tokens, up to `CONTROL_CLIENTS + MAX_CLIENTS`.
const CONTROL_CLIENTS: Token = Token(1000);

/// Packets read from the TUN device per turn.
const TUN_BATCH: usize = 256;
/// Longest sleep when nothing is scheduled.
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// Packets read in one turn from which their acknowledgements leave before the TUN writes.
const EARLY_ACK_BATCH: usize = 8;

/// Why the daemon could not run. Its `Display` is the one line to print, naming the flag or
/// step that failed; exit with [`DaemonError::exit_code`].
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// No local interface has the `--bind` address.
    #[error("--bind {0}: no local interface has this address")]
    NoBindInterface(IpAddr),
    /// The software provider's UDP socket could not be bound.
    #[error("--bind {addr}:{port}: {source}")]
    Bind {
        /// The underlay address.
        addr: IpAddr,
        /// The RoCEv2 UDP port.
        port: u16,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The libibverbs device could not be opened.
    #[cfg(feature = "verbs")]
    #[error("--provider verbs: {0}")]
    VerbsOpen(#[source] crate::hw::HwError),
    /// `--provider verbs` in a build without the `verbs` feature.
    #[cfg(not(feature = "verbs"))]
    #[error("--provider verbs: no RDMA device: built without the `verbs` feature")]
    VerbsNotBuilt,
    /// The CM MAD side channel's socket could not be bound.
    #[error("--mad-port {addr}:{port}: {source}")]
    MadPort {
        /// The underlay address.
        addr: IpAddr,
        /// The side channel's UDP port.
        port: u16,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The endpoint's QPs, CQs and buffers could not be set up on the provider.
    #[error("provider set-up: {0}")]
    Endpoint(#[source] crate::verbs::VerbsError),
    /// The TUN device could not be created.
    #[error("--ifname: {0}")]
    Tun(#[source] io::Error),
    /// The interface MTU could not be set.
    #[error("interface MTU: {0}")]
    InterfaceMtu(#[source] io::Error),
    /// An interface address could not be added.
    #[error("--addr {addr}: {source}")]
    Addr {
        /// The address.
        addr: super::config::Cidr,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The interface could not be brought up.
    #[error("interface up: {0}")]
    InterfaceUp(#[source] io::Error),
    /// The control socket could not be bound.
    #[error("--control-socket {}: {source}", path.display())]
    ControlSocket {
        /// The socket path.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The event loop failed.
    #[error("event loop: {0}")]
    Io(#[from] io::Error),
}

impl DaemonError {
    /// The process exit code: 2 for a set-up step that failed (the configuration does not fit
    /// this host), 1 for a failure of the running loop.
    pub const fn exit_code(&self) -> u8 {
        match self {
            Self::Io(_) => 1,
            _ => 2,
        }
    }
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
        add_counters(out, "", &s);
        add_counters(out, "fault_", &s.faults);
        for (k, v) in [
            ("send_errors", self.send_errors),
            ("udp_gso", u64::from(self.gso_enabled())),
            ("rx_gro_buffers", self.rx_gro_buffers),
            ("tx_gso_trains", self.tx_gso_trains()),
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
        add_counters(out, "hw_", &self.stats());
    }
}

/// The underlay link MTU of `--bind` and the path MTU to use.
fn path_mtu(cfg: &Config) -> Result<crate::verbs::PathMtu, DaemonError> {
    let link_mtu = ifaddr::link_mtu_for(cfg.bind);
    if link_mtu.is_none() {
        return Err(DaemonError::NoBindInterface(cfg.bind));
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
    let mut prov = SoftProvider::bind(soft, offload).map_err(|source| DaemonError::Bind {
        addr: cfg.bind,
        port: cfg.udp_port,
        source,
    })?;
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
    let prov = crate::hw::HwVerbs::open(&hw).map_err(DaemonError::VerbsOpen)?;
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
        CmTransport::Qp1 => {
            Box::new(Gsi::open_for_cm(prov.verbs()).map_err(DaemonError::Endpoint)?)
        }
        CmTransport::Udp => {
            let mut u =
                MadUdp::bind(cfg.bind, cfg.mad_port).map_err(|source| DaemonError::MadPort {
                    addr: cfg.bind,
                    port: cfg.mad_port,
                    source,
                })?;
            poll.registry()
                .register(u.socket_mut(), MAD, Interest::READABLE)?;
            Box::new(u)
        }
    };
    let mut mads: Vec<Mad> = Vec::new();

    let start = Instant::now();
    let ep_cfg = cfg.endpoint_config(path_mtu, seed());
    let mtu = ep_cfg.interface_mtu();
    let mut ep = Endpoint::new(start, prov.verbs(), ep_cfg, mad.provider_qp())
        .map_err(DaemonError::Endpoint)?;

    let mut tun = Tun::create(&cfg.ifname).map_err(DaemonError::Tun)?;
    tun.set_mtu(mtu).map_err(DaemonError::InterfaceMtu)?;
    for c in &cfg.addr {
        let r = match c.addr {
            IpAddr::V4(a) => tun.add_ipv4(a, c.prefix_len),
            IpAddr::V6(a) => tun.add_ipv6(a, c.prefix_len),
        };
        r.map_err(|source| DaemonError::Addr { addr: *c, source })?;
    }
    tun.set_up().map_err(DaemonError::InterfaceUp)?;

    let mut control =
        ControlServer::bind(&cfg.control_socket).map_err(|source| DaemonError::ControlSocket {
            path: cfg.control_socket.clone(),
            source,
        })?;
    let mut signals = Signals::new([SIGINT, SIGTERM])?;

    let mut prov_sources = ProviderSources::register(poll.registry(), &prov, PROVIDER)?;
    poll.registry()
        .register(&mut tun, TUN, Interest::READABLE)?;
    control.register(poll.registry(), CONTROL, CONTROL_CLIENTS)?;
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
        let next = [
            prov.poll_timeout(),
            ep.poll_timeout(),
            control.poll_timeout(),
            stop_deadline,
        ]
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
        let mut signalled = false;
        for ev in events.iter() {
            match ev.token() {
                SIGNALS => signalled = true,
                TUN => tun_ready = true,
                // The MAD transport is read on every turn (QP1 has no readiness of its own),
                // so the side channel's readiness only needs to wake the loop.
                MAD => {}
                t if control.note_readiness(t) => {}
                t => {
                    if let Some(i) = prov_sources.index_of(t) {
                        prov.note_readiness(i);
                    }
                }
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
        let mad_stats = mad.stats();
        control.handle(now, || {
            status(tun.name(), &ep, mad_stats, &prov, now, tun_write_drops)
        });
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
        prov_sources.sync(poll.registry(), &prov)?;
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
    let mut status = Status::from_snapshot(name, &snap);
    if let Some(live) = prov.qp_live() {
        status.counters.qp_live = live;
    }
    prov.counters(&mut status.provider);
    add_counters(&mut status.provider, "cm_", &ep.cm_stats());
    add_counters(&mut status.provider, "mad_", &mad);
    status
        .provider
        .insert("tun_write_drops".to_owned(), tun_write_drops);
    status
}
