//! What `ipoib-cm up` says of itself: the start-up line, the status document served on the
//! control socket and the metrics listener, the warnings of growing drop counters, and the
//! last lines at the stop.

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use super::config::{CmTransport, Config, PathMtuChoice};
use super::floods::{FloodWarnings, FLOOD_WARN_INTERVAL};
use super::provider::DaemonProvider;
use super::status::{Status, Summary, UnderlayStatus, WorkerStatus};
use super::underlay::UnderlayWatch;
use super::workers_setup::{part_status, WorkerReport};
use crate::driver::workers::Workers;
use crate::driver::Node;

/// The daemon's last lines: the suppressed-input summary and the final status.
pub(super) fn report_stop<P: DaemonProvider>(
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

/// The start-up line: what this daemon is and where it listens.
pub(super) fn log_start<P: DaemonProvider>(
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
pub(super) fn warn_floods(floods: &mut FloodWarnings, s: &Status, now: Instant) {
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
pub(super) fn log_id_solved_peers(peers: Vec<IpAddr>) {
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
pub(super) fn status<P: DaemonProvider>(
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
