//! `ipoib-cm up`: the mio event loop made of the driver's [`Node`] turns, the control socket,
//! the metrics listener (`--metrics-listen`) and the signals.
//!
//! One clock read per turn; every source is drained until it would block (each bounded per
//! turn so none starves the others); the loop sleeps until the earliest deadline of the node
//! (provider, endpoint, shutdown bound), the control socket's and metrics listener's clients
//! and the systemd watchdog. SIGINT/SIGTERM, `ipoib-cm down` and the interface deleted under the daemon start
//! an orderly shutdown: stop accepting, DREQ everything, drain with the `drain_timeout` bound,
//! destroy what is left, remove the interface (by closing the TUN device) and return (exit
//! 0). SIGHUP reloads the configuration file ([`Service::reload`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

use super::config::{CmTransport, Config, LinkLayerKind, PathMtuChoice, WORKER_FAULT_AFTER};
use super::control::{ControlServer, Reply, Request, MAX_CLIENTS};
pub use super::error::DaemonError;
use super::floods::{FloodWarnings, FLOOD_WARN_INTERVAL};
use super::metrics::{self, MetricsServer};
use super::provider::DaemonProvider;
use super::service::Service;
use super::status::{render_prometheus, Status, Summary, UnderlayStatus, WorkerStatus};
use super::underlay::{UnderlayChange, UnderlayWatch};
use super::workers_setup::{part_status, start_workers, worker_fault, WorkerOpen, WorkerReport};
use crate::driver::workers::{Wake, WorkerSettings, Workers};
use crate::driver::{Node, NodeConfig, SaDriver};
use crate::ipoib::Mode;
use crate::mad::MadTransport;
use crate::soft::provider::{SoftProvider, UdpOffload};
use crate::soft::sim_port::SimPort;
use crate::soft::transport::UdpTransport;
use crate::soft::SoftConfig;
use crate::sys::ifaddr;
use crate::verbs::setup::os_seed;
use crate::verbs::{Provider, Verbs};
use crate::wire::{WorkerCount, WorkerId};

const SIGNALS: Token = Token(0);
const CONTROL: Token = Token(1);
/// The first of the control clients' tokens, up to `CONTROL_CLIENTS + MAX_CLIENTS`.
const CONTROL_CLIENTS: Token = Token(2);
/// The metrics listener (`--metrics-listen`).
const METRICS: Token = Token(CONTROL_CLIENTS.0 + MAX_CLIENTS);
/// The first of the metrics clients' tokens, up to `METRICS_CLIENTS + metrics::MAX_CLIENTS`.
const METRICS_CLIENTS: Token = Token(METRICS.0 + 1);
/// The netlink socket that wakes the loop when a link or an address changes.
const UNDERLAY: Token = Token(METRICS_CLIENTS.0 + metrics::MAX_CLIENTS);
/// The workers' wake-up of the control loop (`--workers` above 1).
const WORKERS: Token = Token(UNDERLAY.0 + 1);
/// The first of the node's tokens (the rest follow it).
const NODE: usize = WORKERS.0 + 1;

/// How long the first read of a simulated InfiniBand port's SMA may take at start.
const SIM_PORT_FIRST_READ: Duration = Duration::from_secs(5);

/// Longest sleep when nothing is scheduled.
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// The MTU of the link that carries `--bind`.
fn bind_link_mtu(cfg: &Config) -> Result<u32, DaemonError> {
    ifaddr::link_mtu_for(cfg.bind).ok_or(DaemonError::NoBindInterface(cfg.bind))
}

/// Runs the daemon on the software provider until SIGINT or SIGTERM. CM MADs travel over QP1
/// unless `cm_transport` says UDP.
///
/// # Errors
/// A set-up step that failed (one line naming it), or a fatal event-loop error.
pub fn up(cfg: &Config) -> Result<(), DaemonError> {
    if cfg.cm_transport == Some(CmTransport::Umad) {
        return Err(DaemonError::UmadNeedsVerbs);
    }
    if cfg.cm_transport == Some(CmTransport::RdmaCm) {
        return Err(DaemonError::RdmaCmNeedsVerbs);
    }
    let ib = cfg.link_layer == LinkLayerKind::Infiniband;
    if ib && cfg.cm_transport == Some(CmTransport::Udp) {
        return Err(DaemonError::SideChannelOnIb);
    }
    let link_mtu = bind_link_mtu(cfg)?;
    let mut soft = SoftConfig::new(cfg.bind);
    soft.link = cfg.link_layer.into();
    soft.src_port = cfg.udp_port;
    soft.dst_port = cfg.udp_port;
    soft.pkey = cfg.pkey;
    soft.verify_icrc_v4 = cfg.verify_icrc_v4;
    soft.faults = cfg.fault;
    soft.quirks = cfg.quirks;
    soft.qpn_seed = cfg.qpn_seed.unwrap_or_else(os_seed);
    soft.multicast = cfg.multicast;
    soft.multicast_ttl = cfg.multicast_ttl;
    soft.reorder_hold_packets = cfg.reorder_hold;
    let offload = if cfg.udp_offload {
        UdpOffload::On
    } else {
        UdpOffload::Off
    };
    let bind_error = |source| DaemonError::Bind {
        addr: cfg.bind,
        port: cfg.udp_port,
        source,
    };
    let count = cfg.workers;
    let local = SocketAddr::new(cfg.bind, cfg.udp_port);
    let mut sockets = UdpTransport::bind_steered(local, count, soft.link.framing())
        .map_err(bind_error)?
        .into_iter();
    let first = sockets
        .next()
        .ok_or_else(|| bind_error(io::Error::other("no socket bound")))?;
    let mut slots = count.slots();
    let mut control_cfg = soft;
    control_cfg.workers = slots.next().unwrap_or(WorkerId::SINGLE);
    let mut prov = SoftProvider::with_transport(control_cfg, first, offload).map_err(bind_error)?;
    // The other workers' providers: their sockets of the reuseport group, their QPNs
    // tagged; no multicast (control carries the interface's datagrams).
    let others = sockets
        .zip(slots)
        .map(|(socket, slot)| {
            let mut c = soft;
            c.workers = slot;
            c.multicast = false;
            c.qpn_seed = os_seed();
            Box::new(move || SoftProvider::with_transport(c, socket, offload)) as WorkerOpen<_>
        })
        .collect();
    prov.verbs().set_mcast_peers(cfg.peer.clone());
    if ib {
        let (sp, attr) =
            SimPort::open(None, None, SIM_PORT_FIRST_READ).map_err(DaemonError::SimPort)?;
        let (ca, port) = sp.device();
        tracing::info!(
            device = %ca,
            port,
            lid = %attr.lid,
            sm_lid = %attr.sm_lid,
            active = attr.active,
            gid = %attr.gid,
            "InfiniBand port of a simulated fabric, read from its SMA"
        );
        prov.attach_sim_port(Instant::now(), sp, attr);
    }
    if cfg.peer.is_empty() && !prov.multicast_active() {
        tracing::warn!(
            bind = %cfg.bind,
            "neither --peer nor underlay multicast: ARP and ND reach no one; only static --neigh entries and nodes that contact this one first are reachable"
        );
    }
    run(
        cfg,
        prov,
        link_mtu,
        cfg.cm_transport.unwrap_or(CmTransport::Qp1),
        None,
        others,
    )
}

/// What `--workers` above 1 runs with: connected mode; on the software provider our CM over
/// QP1 or the side channel, on libibverbs any CM transport (the kernel's CM runs every
/// worker's ids on control's event channel). `up` checks it before anything is set up.
///
/// # Errors
/// [`DaemonError::WorkersNeed`], naming what is missing.
pub fn check_workers(cfg: &Config) -> Result<(), DaemonError> {
    if cfg.workers == WorkerCount::ONE {
        return Ok(());
    }
    let needs = |needs| DaemonError::WorkersNeed {
        workers: cfg.workers,
        needs,
    };
    if cfg.mode != Mode::Connected {
        return Err(needs(
            "needs connected mode (datagram mode runs on one worker)",
        ));
    }
    match (cfg.provider, cfg.cm_transport) {
        (super::ProviderKind::Soft, None | Some(CmTransport::Qp1 | CmTransport::Udp))
        | (super::ProviderKind::Verbs, _) => Ok(()),
        (super::ProviderKind::Soft, Some(_)) => Err(needs(
            "on the software provider needs --cm-transport qp1 or udp",
        )),
    }
}

/// Runs the daemon on libibverbs (`--provider verbs`) until SIGINT or SIGTERM. CM MADs travel
/// over the UDP side channel unless `cm_transport` says umad (the kernel's QP1 through the
/// umad device of the verbs device and port) or QP1 (which the kernel owns: set-up fails).
///
/// # Errors
/// A set-up step that failed (one line naming it), or a fatal event-loop error.
#[cfg(feature = "verbs")]
pub fn up_verbs(cfg: &Config, hw: &crate::hw::HwConfig) -> Result<(), DaemonError> {
    let link_mtu = bind_link_mtu(cfg)?;
    let mut hw = hw.clone();
    hw.local_ip = hw.local_ip.or(Some(cfg.bind));
    let mut prov = crate::hw::HwVerbs::open(&hw).map_err(DaemonError::VerbsOpen)?;
    let (cm_transport, mad): (_, Option<Box<dyn MadTransport<crate::hw::HwVerbs>>>) =
        match cfg.cm_transport {
            Some(CmTransport::Umad) => (
                CmTransport::Umad,
                Some(Box::new(open_umad(cfg, &mut prov)?)),
            ),
            Some(t) => (t, None),
            None => pick_verbs_transport(cfg, &mut prov)?,
        };
    // The other workers' contexts on the same device and port, each opened in its thread (a
    // context is the thread's that uses it).
    let others = cfg
        .workers
        .slots()
        .skip(1)
        .map(|slot| {
            let hw = hw.clone();
            Box::new(move || {
                let mut v = crate::hw::HwVerbs::open(&hw).map_err(io::Error::other)?;
                v.set_first_comp_vector(slot.index());
                Ok(v)
            }) as WorkerOpen<_>
        })
        .collect();
    run(cfg, prov, link_mtu, cm_transport, mad, others)
}

/// The CM transport of a verbs daemon with no `--cm-transport`: the kernel's CM where
/// librdmacm's device opens (`/dev/infiniband/rdma_cm`: `rdma_ucm` is loaded), else our CM on
/// the kernel's QP1 through umad (registering the CM class fails while `ib_cm` is loaded),
/// else one line naming the side channel. The side channel is never picked: it meets only
/// daemons that also run it.
#[cfg(feature = "verbs")]
#[allow(clippy::type_complexity)]
fn pick_verbs_transport(
    cfg: &Config,
    prov: &mut crate::hw::HwVerbs,
) -> Result<
    (
        CmTransport,
        Option<Box<dyn MadTransport<crate::hw::HwVerbs>>>,
    ),
    DaemonError,
> {
    const RDMA_CM_DEV: &str = "/dev/infiniband/rdma_cm";
    let rdma_cm = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(RDMA_CM_DEV);
    let Err(rdma_cm_err) = rdma_cm else {
        return Ok((CmTransport::RdmaCm, None));
    };
    match open_umad(cfg, prov) {
        Ok(u) => Ok((CmTransport::Umad, Some(Box::new(u)))),
        Err(DaemonError::Umad(e)) => Err(DaemonError::NoCmTransport(format!(
            "{RDMA_CM_DEV}: {rdma_cm_err}; umad: {e}"
        ))),
        Err(e) => Err(e),
    }
}

/// Opens the umad CM transport on the verbs device, port and GID index in use, with the
/// P_Key index of the endpoint's partition.
#[cfg(feature = "verbs")]
fn open_umad(cfg: &Config, prov: &mut crate::hw::HwVerbs) -> Result<crate::mad::Umad, DaemonError> {
    use crate::verbs::Verbs;
    let pkey_index = prov.pkey_index(cfg.pkey).map_err(DaemonError::Endpoint)?;
    let ucfg = crate::mad::UmadConfig {
        device: prov.device_name().to_owned(),
        port: prov.port(),
        gid_index: prov.gid_index(),
        pkey_index,
        sl: 0,
    };
    let umad = crate::mad::Umad::open(ucfg).map_err(DaemonError::Umad)?;
    tracing::info!(
        umad = umad.umad_index(),
        device = prov.device_name(),
        port = prov.port(),
        gid_index = prov.gid_index(),
        pkey_index,
        addressing = if umad.is_roce() { "grh" } else { "lid" },
        "CM MADs on the kernel's QP1 through /dev/infiniband/umad{}",
        umad.umad_index()
    );
    Ok(umad)
}

/// The event loop over any provider, with the CM transport `mad` the caller opened, else the
/// one the node opens for `cm_transport`; `link_mtu` is the `--bind` link's MTU, which bounds
/// the path MTU on RoCE.
fn run<P: DaemonProvider + 'static>(
    cfg: &Config,
    mut prov: P,
    link_mtu: u32,
    cm_transport: CmTransport,
    mad: Option<Box<dyn MadTransport<P::Verbs>>>,
    others: Vec<WorkerOpen<P>>,
) -> Result<(), DaemonError> {
    // Checked against the memory limit before (`resources::check`).
    prov.commit_memory();
    let mut poll = Poll::new()?;
    let mut underlay = UnderlayWatch::open(cfg.bind, Instant::now());
    // The port's active MTU follows what the --bind link carries (the soft port's is that).
    prov.set_link_mtu(link_mtu);
    // On InfiniBand the port is its own link: --bind is no bound there.
    let underlay_mtu = prov.sa_port().is_none().then_some(link_mtu);
    let mut path_mtu = cfg.path_mtu_choice(&prov.verbs().port_attr(), underlay_mtu);
    let node_cfg = NodeConfig {
        ifname: cfg.ifname.clone(),
        endpoint: cfg.endpoint_config(path_mtu.path_mtu, os_seed()),
        cm_transport,
        mad_udp: SocketAddr::new(cfg.bind, cfg.mad_port),
        rdma_cm_bind: cfg.bind,
        // Only a native InfiniBand port has an SA.
        link_layer: if prov.sa_port().is_some() {
            crate::cm::LinkLayer::InfiniBand
        } else {
            crate::cm::LinkLayer::Ethernet
        },
        tun_write_rate: cfg.fault_tun_rate.and_then(std::num::NonZeroU32::new),
    };
    // The workers' wake-up of this loop (none with one worker: no descriptor of its own).
    let control_wake = (!others.is_empty())
        .then(|| Wake::new(poll.registry(), WORKERS))
        .transpose()?;
    let (mut node, mut workers) = match &control_wake {
        None => {
            let node = match mad {
                Some(mad) => Node::with_transport(
                    Instant::now(),
                    prov,
                    node_cfg,
                    mad,
                    poll.registry(),
                    NODE,
                )?,
                None => Node::new(Instant::now(), prov, node_cfg, poll.registry(), NODE)?,
            };
            (node, None)
        }
        Some(wake) => {
            let (node, workers) = start_workers(
                cfg, prov, node_cfg, mad, others, link_mtu, &poll, NODE, wake,
            )?;
            (node, Some(workers))
        }
    };
    let sa = attach_sa(&mut node, cfg, &poll)?;
    let mut control =
        ControlServer::bind(&cfg.control_socket).map_err(|source| DaemonError::ControlSocket {
            path: cfg.control_socket.clone(),
            source,
        })?;
    let mut metrics = match cfg.metrics_listen {
        Some(addr) => Some(
            MetricsServer::bind(addr)
                .map_err(|source| DaemonError::MetricsListen { addr, source })?,
        ),
        None => None,
    };
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    control.register(poll.registry(), CONTROL, CONTROL_CLIENTS)?;
    if let Some(m) = &mut metrics {
        m.register(poll.registry(), METRICS, METRICS_CLIENTS)?;
    }
    poll.registry()
        .register(&mut signals, SIGNALS, Interest::READABLE)?;
    underlay.register(poll.registry(), UNDERLAY)?;
    let started = Instant::now();
    super::resources::log_found();
    log_start(cfg, &node, &path_mtu, cm_transport, &sa);
    let mut service = Service::new(cfg);
    service.ready(started);

    let mut floods = FloodWarnings::default();
    // `--fault-worker` struck (once).
    let mut faulted = false;
    let mut events = Events::with_capacity(256);
    let mut last_event = Instant::now();
    // The --bind link's MTU the port follows now.
    let mut link_mtu_now = link_mtu;
    loop {
        let now = Instant::now();
        let next = [
            node.poll_timeout(),
            control.poll_timeout(),
            metrics.as_ref().and_then(MetricsServer::poll_timeout),
            service.poll_timeout(),
            underlay.poll_timeout(),
        ]
        .into_iter()
        .flatten()
        .min();
        // Busy polling: for `busy_poll` after the last event, look for events without
        // sleeping, so a packet arriving then costs no wakeup.
        let spinning = now < last_event + service.config().busy_poll;
        let pending =
            node.has_pending_input() || workers.as_ref().is_some_and(Workers::has_pending);
        let timeout = if pending || spinning {
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
        // Before anything the workers posted is read (control's node reads their MADs and
        // datagrams, then their requests): whatever they post from now on wakes the next poll.
        if let Some(wake) = &control_wake {
            wake.clear();
        }
        if events.is_empty() && spinning && !pending && next.is_none_or(|t| t > now) {
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
                WORKERS => {}
                t if node.note_readiness(t) => {}
                t if underlay.note_readiness(t, now) => {}
                t if control.note_readiness(t) => {}
                t => {
                    if let Some(m) = &mut metrics {
                        m.note_readiness(t);
                    }
                }
            }
        }
        node.turn(now)?;
        if let Some(w) = &mut workers {
            w.turn(now, &mut node);
            w.check(now)?;
            if let Some(fault) = cfg
                .fault_worker
                .filter(|_| now >= started + WORKER_FAULT_AFTER)
            {
                if !faulted {
                    faulted = true;
                    w.apply("--fault-worker", || worker_fault(fault));
                }
            }
        }
        control.serve(now, |req| match req {
            Request::Status { .. } => Reply::Status(Box::new(status(
                &node,
                workers.as_ref(),
                &path_mtu,
                &underlay,
                now,
                started,
            ))),
            _ => service.command(&mut node, now, req),
        });
        if let Some(m) = &mut metrics {
            m.handle(now, || {
                render_prometheus(&status(
                    &node,
                    workers.as_ref(),
                    &path_mtu,
                    &underlay,
                    now,
                    started,
                ))
            });
        }
        if floods.due(now) {
            super::logging::report_suppressed(now);
            warn_floods(
                &mut floods,
                &status(&node, workers.as_ref(), &path_mtu, &underlay, now, started),
                now,
            );
            log_id_solved_peers(node.provider_mut().take_id_solved_peers());
        }
        if signalled {
            for sig in signals.pending() {
                if sig == SIGHUP {
                    service.request_reload(now);
                } else {
                    tracing::info!(signal = sig, "shutting down");
                    service.stop(&mut node, now);
                }
            }
        }
        if node.interface_removed() && !node.is_shutting_down() {
            tracing::warn!("interface {} was removed; shutting down", node.ifname());
            service.stop(&mut node, now);
        }
        service.turn(now);
        service.reload_step(&mut node, now);
        if node.take_port_active() {
            // The port is back, perhaps at another MTU (an SM's, or rxe's netdev's).
            let link = underlay.state().mtu().unwrap_or(link_mtu);
            link_mtu_now = link;
            path_mtu = follow_link_mtu(&mut node, cfg, link, now, &path_mtu);
        }
        if let Some(changes) = underlay.turn(now) {
            for change in changes {
                change.log(cfg.bind, underlay.state());
                if let UnderlayChange::Mtu { to, .. } = change {
                    link_mtu_now = to;
                    path_mtu = follow_link_mtu(&mut node, cfg, to, now, &path_mtu);
                }
            }
            node.check_interface();
        }
        if let Some(w) = &mut workers {
            // What control decided this turn (a link or path MTU, a reload) reaches every
            // worker, the newest whenever its queue has room.
            w.set_settings(WorkerSettings {
                link_mtu: link_mtu_now,
                path_mtu: path_mtu.path_mtu,
                live: node.endpoint().live_settings(),
            });
            if node.is_shutting_down() && !w.is_stopping() {
                w.begin_shutdown(now, node.endpoint().config().drain_timeout);
            }
        }
        node.flush(now, poll.registry())?;
        if node.provider_mut().take_link_suspect() {
            // Read the link soon (the loop's timeout includes the read's deadline).
            underlay.suspect(now);
        }
        if let Some(why) = node.device_gave_up() {
            let why = why.to_owned();
            report_stop(&node, workers.as_ref(), &path_mtu, &underlay, now, started);
            drop(node);
            return Err(DaemonError::DeviceLost(why));
        }
        if let Some(Err(e)) = workers.as_ref().map(|w| w.overdue(now)) {
            // A worker stuck where nothing reaches it: the process ends without it.
            node.wind_up(now)?;
            report_stop(&node, workers.as_ref(), &path_mtu, &underlay, now, started);
            drop(node);
            return Err(e.into());
        }
        if node.should_finish(now) && workers.as_ref().is_none_or(Workers::all_ended) {
            node.wind_up(now)?;
            report_stop(&node, workers.as_ref(), &path_mtu, &underlay, now, started);
            if let Some(w) = workers.take() {
                w.join()?;
            }
            // Dropping the node closes the last TUN queue, which removes the interface.
            drop(node);
            return Ok(());
        }
    }
}

/// The daemon's last lines: the suppressed-input summary and the final status.
fn report_stop<P: DaemonProvider>(
    node: &Node<P>,
    workers: Option<&Workers<P, WorkerReport>>,
    path_mtu: &PathMtuChoice,
    underlay: &UnderlayWatch,
    now: Instant,
    started: Instant,
) {
    super::logging::flush_suppressed(now);
    log_stop(&status(node, workers, path_mtu, underlay, now, started));
}

/// How often the SA is asked whether it still lists the port in the broadcast group, where
/// the port cannot report `CLIENT_REREGISTER` itself (a simulated one).
const MEMBERSHIP_CHECK: Duration = Duration::from_secs(1);

/// On a native InfiniBand port, hands the node's groups and paths to an SA client on the
/// port's umad device; returns what the start-up line says of it.
fn attach_sa<P: DaemonProvider>(
    node: &mut Node<P>,
    cfg: &Config,
    poll: &Poll,
) -> Result<String, DaemonError> {
    let Some((ca, port)) = node.provider().sa_port() else {
        return Ok("none (RoCE)".to_owned());
    };
    let mut sa = SaDriver::open(Some(&ca), Some(port), cfg.pkey.0)
        .map_err(|source| DaemonError::Sa { ca, port, source })?;
    if !node.provider().reports_reregister() {
        sa.check_memberships(Instant::now(), MEMBERSHIP_CHECK);
    }
    let p = sa.port();
    let line = format!(
        "{} port {} lid {:#x} sm_lid {:#x}{}",
        p.ca,
        p.port,
        p.lid,
        p.sm_lid,
        if p.kernel_ipoib {
            " (kernel ipoib on this port: groups shared, never DELETEd)"
        } else {
            ""
        }
    );
    node.attach_sa(Instant::now(), sa, poll.registry());
    Ok(line)
}

/// The `--bind` link's MTU is now `link_mtu`: the provider's port follows it, the path MTU is
/// chosen again as at start, and the node follows a changed one. Returns the new choice.
fn follow_link_mtu<P: DaemonProvider>(
    node: &mut Node<P>,
    cfg: &Config,
    link_mtu: u32,
    now: Instant,
    before: &PathMtuChoice,
) -> PathMtuChoice {
    node.provider_mut().set_link_mtu(link_mtu);
    let underlay = node.provider().sa_port().is_none().then_some(link_mtu);
    let port = node.provider_mut().verbs().port_attr();
    let choice = cfg.path_mtu_choice(&port, underlay);
    if let Some(c) = node.set_path_mtu(now, choice.path_mtu) {
        tracing::info!(
            "path MTU {} -> {} ({choice}): {} tx and {} rx connections set up again",
            c.from.bytes(),
            c.to.bytes(),
            c.tx_reconnects,
            c.rx_reconnects
        );
    } else if choice.path_mtu != before.path_mtu {
        // The device is down: the endpoint built when it is back takes the new MTU.
        tracing::info!(
            "path MTU {} -> {} ({choice})",
            before.path_mtu.bytes(),
            choice.path_mtu.bytes()
        );
    }
    choice
}

/// The start-up line: what this daemon is and where it listens.
fn log_start<P: DaemonProvider>(
    cfg: &Config,
    node: &Node<P>,
    path_mtu: &PathMtuChoice,
    cm_transport: CmTransport,
    sa: &str,
) {
    let peers = if cfg.peer.is_empty() {
        "none".to_owned()
    } else {
        cfg.peer
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    let addrs = cfg
        .addr
        .iter()
        .map(|c| format!("{}/{}", c.addr, c.prefix_len))
        .collect::<Vec<_>>()
        .join(",");
    let ep = node.endpoint().config();
    tracing::info!(
        version = %env!("CARGO_PKG_VERSION"),
        ifname = %node.ifname(),
        addr = %addrs,
        bind = %SocketAddr::new(cfg.bind, cfg.udp_port),
        peers = %peers,
        mode = %ep.mode,
        srq = ep.srq,
        cm_transport = %cm_transport.as_str(),
        provider = %match cfg.provider {
            super::ProviderKind::Soft => "soft",
            super::ProviderKind::Verbs => "verbs",
        },
        control_socket = %cfg.control_socket.display(),
        metrics_listen = %cfg.metrics_listen.map_or_else(|| "off".to_owned(), |a| a.to_string()),
        hwaddr = %node.endpoint().hwaddr(),
        mtu = ep.interface_mtu(),
        path_mtu = path_mtu.path_mtu.bytes(),
        path_mtu_from = %path_mtu,
        port_max_mtu = path_mtu.port_max.bytes(),
        sa = %sa,
        "started"
    );
}

/// The shutdown line: the totals and the connection counters, `key=value`.
fn log_stop(s: &Status) {
    let mut line = format!("uptime_s={}", s.summary.uptime_s);
    for (k, v) in s
        .summary
        .totals
        .fields()
        .into_iter()
        .chain(s.counters.fields())
    {
        line.push_str(&format!(" {k}={v}"));
    }
    tracing::info!("stopped {line}");
}

/// The receive drop counters that count what the host could not take (the TUN device
/// refusing packets, no spare receive buffer while packets waited for it), not bad input.
const HOST_BEHIND_DROPS: [&str; 2] = ["tun_write_drops", "rx_buffer_drops"];

/// Warns of the receive drop counters that grew, each at most once per
/// [`FLOOD_WARN_INTERVAL`](super::floods::FLOOD_WARN_INTERVAL): bad input, or a host that
/// did not keep up ([`HOST_BEHIND_DROPS`]).
fn warn_floods(floods: &mut FloodWarnings, s: &Status, now: Instant) {
    let drops = s.summary.drops.rx.iter().map(|(k, v)| (k.as_str(), *v));
    for (kind, count) in floods.observe(now, drops) {
        let what = if HOST_BEHIND_DROPS.contains(&kind.as_str()) {
            "dropped: the host did not keep up"
        } else {
            "bad input dropped"
        };
        tracing::warn!(
            "{what} kind={kind} count={count} (one line per kind per {}s at most)",
            FLOOD_WARN_INTERVAL.as_secs()
        );
    }
}

/// One line per underlay peer, the first time its IPv4 ICRCs check only with a nonzero IP ID
/// (the provider remembers the peers, at most 64, so each is named once).
fn log_id_solved_peers(peers: Vec<IpAddr>) {
    for peer in peers {
        tracing::info!(
            %peer,
            "peer {peer}: IPv4 ICRCs check only with a nonzero IP ID (a sender that picks its \
             own IDs, such as Linux rxe); accepted by solving for the ID, which leaves a 2^-16 \
             false-accept chance per corrupted packet (--no-icrc-v4 turns the check off)"
        );
    }
}

/// The status snapshot served on the control socket: control's node and every worker's
/// last report, summed, with what is per interface.
fn status<P: DaemonProvider>(
    node: &Node<P>,
    workers: Option<&Workers<P, WorkerReport>>,
    path_mtu: &PathMtuChoice,
    underlay: &UnderlayWatch,
    now: Instant,
    started: Instant,
) -> Status {
    let mut status = part_status(node, now);
    status.workers = vec![WorkerStatus::of(0, &status, crate::sys::thread::cpu_time())];
    if let Some(w) = workers {
        status
            .provider
            .insert("rx_foreign_queue_drops".to_owned(), w.foreign_dropped());
        super::status::add_counters(&mut status.provider, "mad_route_", &w.mad_routes());
        status
            .provider
            .insert("handed_bytes_drops".to_owned(), w.handed_dropped());
    }
    for (slot, report) in workers.map(Workers::reports).unwrap_or_default() {
        let Some(r) = report else {
            status.workers.push(WorkerStatus {
                index: slot.index(),
                ..WorkerStatus::default()
            });
            continue;
        };
        status.absorb(&r.status);
        status
            .workers
            .push(WorkerStatus::of(slot.index(), &r.status, r.cpu));
    }
    status.interface.cm_transport = node.cm_transport().as_str().to_owned();
    status.interface.path_mtu = u32::try_from(path_mtu.path_mtu.bytes()).unwrap_or(0);
    status.interface.path_mtu_from = path_mtu.to_string();
    let u = underlay.state();
    status.interface.underlay = Some(UnderlayStatus {
        link: u.link.clone(),
        state: u.condition(),
        mtu: u.mtu().unwrap_or(0),
    });
    let uptime_s = now.saturating_duration_since(started).as_secs();
    status.summary = Summary::new(uptime_s, &status.counters, &status.provider);
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::workers::WorkerError;
    use crate::driver::NodeError;
    use std::net::Ipv4Addr;

    fn boom() -> io::Error {
        io::Error::other("boom")
    }

    #[test]
    fn a_failed_worker_is_exit_status_1_and_a_worker_count_that_cannot_run_2() {
        let failed = DaemonError::Worker(WorkerError::Panicked(1));
        assert_eq!(
            (failed.exit_code(), failed.to_string().as_str()),
            (1, "worker 1: panicked")
        );
        let refused = DaemonError::WorkersNeed {
            workers: WorkerCount::new(2).unwrap(),
            needs: "needs connected mode",
        };
        assert_eq!(refused.exit_code(), 2);
        assert_eq!(refused.to_string(), "--workers 2: needs connected mode");
    }

    #[test]
    fn a_node_set_up_error_names_the_flag_that_configures_the_step() {
        let bind = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
        let cases = [
            (
                NodeError::MadBind {
                    addr: SocketAddr::new(bind, 4792),
                    source: boom(),
                },
                "--mad-port 198.18.0.1:4792: boom",
                2,
            ),
            (NodeError::Tun(boom()), "--ifname: boom", 2),
            (NodeError::InterfaceMtu(boom()), "interface MTU: boom", 2),
            (
                NodeError::Addr {
                    addr: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
                    prefix_len: 24,
                    source: boom(),
                },
                "--addr 10.0.0.1/24: boom",
                2,
            ),
            (NodeError::InterfaceUp(boom()), "interface up: boom", 2),
            (NodeError::Register(boom()), "event loop: boom", 1),
        ];
        for (node, line, code) in cases {
            let e = DaemonError::from(node);
            assert_eq!(e.to_string(), line);
            assert_eq!(e.exit_code(), code, "{line}");
        }
    }

    #[test]
    fn a_device_lost_for_good_exits_3_with_its_line() {
        let e = DaemonError::DeviceLost(
            "device context lost and 64 reopens failed; last: no device".to_owned(),
        );
        assert_eq!(
            e.to_string(),
            "device context lost and 64 reopens failed; last: no device"
        );
        assert_eq!(e.exit_code(), DaemonError::DEVICE_LOST_EXIT);
        assert_eq!(DaemonError::DEVICE_LOST_EXIT, 3);
    }

    #[test]
    fn a_metrics_address_that_cannot_be_bound_names_the_flag() {
        let held = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = held.local_addr().unwrap();
        let e = MetricsServer::bind(addr)
            .map(|_| ())
            .map_err(|source| DaemonError::MetricsListen { addr, source })
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("--metrics-listen {addr}: Address already in use")
        );
        assert_eq!(e.exit_code(), 2);
    }
}
