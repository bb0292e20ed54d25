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
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

use super::config::{CmTransport, Config, PathMtuChoice, WORKER_FAULT_AFTER};
use super::control::{ControlServer, Reply, Request, MAX_CLIENTS};
pub use super::error::DaemonError;
use super::floods::FloodWarnings;
use super::metrics::{self, MetricsServer};
#[cfg(feature = "verbs")]
pub use super::open::up_verbs;
pub use super::open::{check_workers, up};
use super::provider::DaemonProvider;
use super::report::{log_id_solved_peers, log_start, report_stop, status, warn_floods};
use super::service::Service;
use super::status::render_prometheus;
use super::underlay::{UnderlayChange, UnderlayWatch};
use super::workers_setup::{start_workers, worker_fault, WorkerOpen};
use crate::driver::workers::{Wake, WorkerSettings, Workers};
use crate::driver::{Node, NodeConfig, SaDriver};
use crate::mad::MadTransport;
use crate::verbs::setup::os_seed;
use crate::verbs::Verbs;

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

/// Longest sleep when nothing is scheduled.
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// The event loop over any provider, with the CM transport `mad` the caller opened, else the
/// one the node opens for `cm_transport`; `link_mtu` is the `--bind` link's MTU, which bounds
/// the path MTU on RoCE.
pub(super) fn run<P: DaemonProvider + 'static>(
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
