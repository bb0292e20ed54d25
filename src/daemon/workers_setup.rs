//! `ipoib-cm up --workers N`: control's node on the first queue of the interface, the other
//! workers' threads started beside it, what they report, and the changes control makes on
//! them (docs/multi-queue.md). The loop that turns them is `run.rs`'s.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Poll;

use super::config::{Config, WorkerFault, WORKER_STALL};
use super::error::DaemonError;
use super::provider::DaemonProvider;
use super::status::{add_counters, Status, Summary};
use crate::driver::workers::{
    Change, ReportFn, SettingsFn, Wake, WorkerSettings, WorkerSpec, Workers, WorkersSetup,
};
use crate::driver::{Node, NodeConfig};
use crate::ipoib::InterfaceRxCounts;
use crate::mad::{CmTransport, MadTransport};
use crate::sys::tun::Tun;
use crate::verbs::setup::os_seed;
use crate::wire::WorkerId;

/// Opens a worker's provider, in its thread.
pub(super) type WorkerOpen<P> = Box<dyn FnOnce() -> io::Result<P> + Send>;

/// What a worker publishes: its share of the status, and its thread's CPU time.
#[derive(Debug, Clone)]
pub(super) struct WorkerReport {
    pub(super) status: Status,
    pub(super) cpu: Duration,
}

/// The change `--fault-worker` makes on every worker: a panic, or a stall of
/// [`WORKER_STALL`] (after which the daemon has ended anyway: its check gives up on a worker
/// after the stall limit).
#[allow(clippy::panic)]
pub(super) fn worker_fault<P: DaemonProvider>(fault: WorkerFault) -> Change<P> {
    match fault {
        WorkerFault::Panic => Box::new(|_, _| panic!("--fault-worker panic")),
        WorkerFault::Stall => Box::new(|_, _| std::thread::sleep(WORKER_STALL)),
    }
}

/// Makes a worker's node follow control's settings: its provider's port the link MTU, its
/// connections the path MTU, its endpoint the live settings (each a no-op when unchanged).
fn follow_settings<P: DaemonProvider>(node: &mut Node<P>, s: &WorkerSettings, now: Instant) {
    node.provider_mut().set_link_mtu(s.link_mtu);
    node.set_path_mtu(now, s.path_mtu);
    node.endpoint_mut().follow_live_settings(s.live);
}

/// Sets up control's node on the first queue of a multi-queue interface, with its CM
/// transport routing the workers' MADs, and starts the other workers' threads, each with its
/// queue and the provider `others` opens, all sharing one RX budget.
#[allow(clippy::too_many_arguments)]
pub(super) fn start_workers<P: DaemonProvider + 'static>(
    cfg: &Config,
    mut prov: P,
    node_cfg: NodeConfig,
    mad: Option<Box<dyn MadTransport<P::Verbs>>>,
    others: Vec<WorkerOpen<P>>,
    link_mtu: u32,
    poll: &Poll,
    first_token: usize,
    wake: &Arc<Wake>,
) -> Result<(Node<P>, Workers<P, WorkerReport>), DaemonError> {
    let count = cfg.workers;
    let cm_transport = node_cfg.cm_transport;
    let mut node_cfg = node_cfg;
    node_cfg.endpoint.worker = count.slots().next().unwrap_or(WorkerId::SINGLE);
    let mut setup = WorkersSetup::new(count, wake)?;
    let inner = match mad {
        Some(m) => m,
        None => Node::open_transport(&mut prov, &node_cfg)?,
    };
    let routed = Box::new(setup.routed(inner));
    // The port as control's provider has it now: each worker's provider opens on it (later
    // changes come with control's turns).
    let port = prov.port_view().map(Arc::new);
    let mut queues = Tun::create_queues(&cfg.ifname, usize::from(count.get()))
        .map_err(DaemonError::Tun)?
        .into_iter();
    let first = queues
        .next()
        .ok_or_else(|| DaemonError::Tun(io::Error::other("no TUN queue")))?;
    let mut node = Node::control(
        Instant::now(),
        prov,
        node_cfg.clone(),
        routed,
        first,
        poll.registry(),
        first_token,
    )?;
    if cm_transport == CmTransport::RdmaCm {
        node.route_kcm(setup.kcm_route());
    }
    let share = Arc::new(InterfaceRxCounts::default());
    node.endpoint_mut().share_rx_budget(Arc::clone(&share));
    let specs = others
        .into_iter()
        .zip(queues)
        .zip(count.slots().skip(1))
        .map(|((open, tun), slot)| {
            let mut node = node_cfg.clone();
            node.endpoint.worker = slot;
            node.endpoint.seed = os_seed();
            let share = Arc::clone(&share);
            let port = port.clone();
            let open = move || {
                let mut p = open()?;
                // Before the node reads the port (its GID, LID, MTU).
                if let Some(view) = port {
                    p.follow_port_view(&view);
                }
                p.set_link_mtu(link_mtu);
                p.commit_memory();
                Ok(p)
            };
            WorkerSpec {
                slot,
                open: Box::new(open),
                node,
                tun,
                setup: Some(Box::new(move |n: &mut Node<P>, _| {
                    n.endpoint_mut().share_rx_budget(share);
                })),
            }
        })
        .collect();
    let report: ReportFn<P, WorkerReport> = Arc::new(|node, now| WorkerReport {
        status: part_status(node, now),
        cpu: crate::sys::thread::cpu_time(),
    });
    let settings: SettingsFn<P> = Arc::new(follow_settings);
    let workers = setup.spawn(node.endpoint().interface(), specs, report, settings)?;
    tracing::info!(
        workers = count.get(),
        "{} workers: each with its TUN queue, socket, connections and reaper",
        count
    );
    Ok((node, workers))
}

/// The status of what `node` carries (its endpoint, provider, transport and TUN queue),
/// without what is per interface; its summary counts what it carried.
pub(super) fn part_status<P: DaemonProvider>(node: &Node<P>, now: Instant) -> Status {
    let ep = node.endpoint();
    let snap = ep.snapshot(now);
    let mut status = Status::from_snapshot(node.ifname(), &snap);
    let prov = node.provider();
    if let Some(live) = prov.qp_live() {
        status.counters.qp_live = live;
    }
    prov.counters(&mut status.provider);
    add_counters(&mut status.provider, "cm_", &ep.cm_stats());
    add_counters(&mut status.provider, "mad_", &node.mad_stats());
    add_counters(&mut status.provider, "", &node.device_stats());
    if let Some(sa) = node.sa() {
        let p = sa.port();
        status.interface.port = Some(super::status::PortStatus {
            link_layer: "infiniband".to_owned(),
            device: p.ca,
            port: p.port,
            lid: p.lid,
            sm_lid: p.sm_lid,
            pkey: sa.pkey(),
        });
        add_counters(&mut status.provider, "sa_", &sa.counters());
        add_counters(&mut status.provider, "sa_", &sa.stats());
    }
    if let Some(k) = node.kcm_stats() {
        add_counters(&mut status.provider, "rdmacm_", &k);
    }
    let tun = node.tun_stats();
    for (k, v) in [
        ("tun_write_drops", tun.write_drops),
        ("tun_written", tun.written),
        ("tun_written_bytes", tun.written_bytes),
    ] {
        status.provider.insert(k.to_owned(), v);
    }
    status.summary = Summary::new(0, &status.counters, &status.provider);
    status
}
