//! `ipoib-cm up`'s first steps: the checks of what the settings need, and the provider opened
//! (the software provider on its socket group, with a simulated InfiniBand port where asked;
//! libibverbs with its CM transport), then handed to the loop ([`super::run`]).

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::config::{CmTransport, Config, LinkLayerKind};
use super::error::DaemonError;
use super::run::run;
use super::workers_setup::WorkerOpen;
use crate::ipoib::Mode;
#[cfg(feature = "verbs")]
use crate::mad::MadTransport;
use crate::soft::provider::{SoftProvider, UdpOffload};
use crate::soft::sim_port::SimPort;
use crate::soft::transport::UdpTransport;
use crate::soft::SoftConfig;
use crate::sys::ifaddr;
use crate::verbs::setup::os_seed;
use crate::verbs::Provider;
use crate::wire::{WorkerCount, WorkerId};

/// How long the first read of a simulated InfiniBand port's SMA may take at start.
const SIM_PORT_FIRST_READ: Duration = Duration::from_secs(5);

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
