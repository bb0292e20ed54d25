//! `ipoib-cm sa node`: the daemon's SA driver ([`SaDriver`]) between a umad port and an
//! [`Endpoint`], exactly as [`Node`](crate::driver::Node) runs it, on an in-memory software
//! device (the verbs provider cannot run where the SA is simulated: ibsim has no uverbs).
//!
//! It prints one line per thing the endpoint is told or does: `joined` (with the group's
//! record and the MLID the UD QP is attached with), `broadcast` (the Q_Key and UD MTU the
//! endpoint took from the broadcast group), `path` (the record the endpoint holds for a
//! `--dgid`), `sent` / `held` (a `--send` packet before and after its send-only join),
//! `waiting` (a `--connect` packet held for its path), `req` (the REQ of its connection, with
//! the path's LIDs), `dropped` (held packets dropped when the path query failed), `left` at
//! the end.

use super::sa_args::SaToolError;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token};

use crate::driver::SaDriver;
use crate::ipoib::{Endpoint, EndpointConfig};
use crate::sa::SaEvent;
use crate::soft::{SoftConfig, SoftVerbs};
use crate::verbs::{AsyncEvent, Gid, PKey, QpNum};
use crate::wire::cm::{CmMad, CmMessage};
use crate::wire::ipoib::{broadcast_mgid, HwAddr};

/// How long the leaves at the end may take.
const LEAVE_LIMIT: Duration = Duration::from_secs(10);

/// What the node does once the broadcast group is joined.
pub(super) struct Targets<'a> {
    /// Ask for the path to each.
    pub(super) dgids: &'a [Ipv6Addr],
    /// Send a packet to each multicast group.
    pub(super) sends: &'a [Ipv6Addr],
    /// Send a packet to a static neighbour at each GID (opening a connection).
    pub(super) connects: &'a [Ipv6Addr],
}

/// The static neighbour standing for `--connect` GID number `i`: an address of the second
/// default prefix, and a connected-mode hardware address with that GID.
fn connect_neighbour(i: usize, gid: Ipv6Addr) -> (IpAddr, HwAddr) {
    let n = u16::try_from(i).unwrap_or(u16::MAX);
    let ip = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, 0, 0, 1, n);
    let hw = HwAddr::new(HwAddr::FLAG_CONNECTED, QpNum::new(0x48), Gid(gid.octets()));
    (IpAddr::V6(ip), hw)
}

/// Runs until SIGINT/SIGTERM.
pub(super) fn run(
    ca: Option<&str>,
    port: Option<u8>,
    pkey: u16,
    addrs: &[String],
    targets: &Targets<'_>,
) -> Result<(), SaToolError> {
    let (dgids, sends) = (targets.dgids, targets.sends);
    let mut cidrs = Vec::new();
    let given: Vec<&str> = if addrs.is_empty() {
        vec!["198.19.0.2/24", "2001:db8:19::2/64"]
    } else {
        addrs.iter().map(String::as_str).collect()
    };
    for a in given {
        let bad = || SaToolError::BadAddr((*a).to_owned());
        let (addr, len) = a.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let len: u8 = len.parse().map_err(|_| bad())?;
        cidrs.push((addr, len));
    }
    let src6 = cidrs.iter().find_map(|(a, _)| match a {
        IpAddr::V6(v) => Some(*v),
        IpAddr::V4(_) => None,
    });
    let mut sa = SaDriver::open(ca, port, pkey).map_err(SaToolError::SaDriver)?;
    let p = sa.port();
    println!(
        "sa port {} {} lid {:#x} sm_lid {:#x} gid {} kernel_ipoib {}",
        p.ca, p.port, p.lid, p.sm_lid, p.gid, p.kernel_ipoib
    );
    let now = Instant::now();
    let mut v = SoftVerbs::new(SoftConfig::new(IpAddr::from([198, 18, 0, 2])));
    let mut cfg = EndpointConfig::new(cidrs);
    cfg.pkey = PKey(pkey);
    // A 4096-byte IB port: the broadcast group's MTU clamps the UD MTU.
    cfg.path_mtu = crate::verbs::PathMtu::Mtu4096;
    cfg.static_neighbours = targets
        .connects
        .iter()
        .enumerate()
        .map(|(i, g)| connect_neighbour(i, *g))
        .collect();
    let default_qkey = cfg.qkey.0;
    let mut ep = Endpoint::new(now, &mut v, cfg, None).map_err(SaToolError::Endpoint)?;
    ep.use_sa_groups(&mut v);
    let mut poll = Poll::new().map_err(SaToolError::io("poll"))?;
    let registered = sa.register(poll.registry(), Token(0));
    println!("umad registered with epoll: {registered}");

    let stop = Arc::new(AtomicBool::new(false));
    let rereg = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .map_err(SaToolError::io("signal handler"))?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGUSR1, Arc::clone(&rereg))
        .map_err(SaToolError::io("signal handler"))?;

    let bcast = broadcast_mgid(ep.config().mgid_pkey());
    let mut asked = false;
    let mut path_failed_drops = 0;
    let mut leave_by: Option<Instant> = None;
    let mut events = Events::with_capacity(16);
    loop {
        let now = Instant::now();
        let wait = sa
            .poll_timeout()
            .map_or(Duration::from_millis(100), |t| {
                t.saturating_duration_since(now)
            })
            .min(Duration::from_millis(100));
        if let Err(e) = poll.poll(&mut events, Some(wait)) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(SaToolError::Io {
                    what: "poll",
                    source: e,
                });
            }
        }
        let now = Instant::now();
        let mut told = Vec::new();
        sa.pump(now, &mut ep, &mut v, |ev| told.push(*ev));
        for ev in told {
            match ev {
                SaEvent::Joined { mgid, params } => {
                    let group = ep.group(mgid);
                    println!(
                        "joined mgid {mgid} mlid {:#x} qkey {:#x} mtu {} sl {} rate {} send_only {} attached_mlid {}",
                        params.mlid,
                        params.qkey,
                        params.mtu.map_or(0, |m| m.bytes()),
                        params.sl,
                        params.rate,
                        group.is_some() && ep.attached_mlid(mgid).is_none(),
                        ep.attached_mlid(mgid).map_or("none".to_owned(), |m| format!("{m:#x}")),
                    );
                    if mgid == bcast {
                        println!(
                            "broadcast qkey {:#x} (default {default_qkey:#x}) ud_mtu {} interface_mtu {}",
                            ep.config().qkey.0,
                            ep.ud_mtu(),
                            ep.interface_mtu()
                        );
                    }
                }
                SaEvent::PathResolved { dgid, .. } => {
                    if let Some(p) = ep.path(dgid) {
                        println!(
                            "path dgid {} sgid {} dlid {:#x} slid {:#x} sl {} mtu {}",
                            p.dgid,
                            p.sgid,
                            p.dlid.0,
                            p.slid.0,
                            p.sl.get(),
                            p.mtu.bytes(),
                        );
                    }
                }
                SaEvent::PathFailed { dgid, status } => {
                    println!("path failed dgid {dgid} status {status:?}");
                }
                SaEvent::JoinFailed { mgid, status } => {
                    println!("join failed mgid {mgid} status {status:?}");
                }
                SaEvent::Left { mgid, deleted } => println!("left mgid {mgid} deleted {deleted}"),
                SaEvent::MembershipLost { mgid } => println!("membership lost mgid {mgid}"),
            }
        }
        if !asked && ep.broadcast_group().is_some() {
            asked = true;
            for d in dgids {
                ep.want_path(Gid(d.octets()));
            }
            for g in sends {
                let before = ep.counters().tx_dropped;
                ep.handle_tun_packet(now, &mut v, &udp6(src6.unwrap_or(Ipv6Addr::LOCALHOST), *g));
                let held = ep.counters().tx_dropped > before;
                println!(
                    "{} group {g} (before its join answered)",
                    if held { "held" } else { "sent" }
                );
            }
            for (i, g) in targets.connects.iter().enumerate() {
                let (ip, _) = connect_neighbour(i, *g);
                let IpAddr::V6(dst) = ip else { continue };
                ep.handle_tun_packet(now, &mut v, &udp6(src6.unwrap_or(Ipv6Addr::LOCALHOST), dst));
                println!(
                    "waiting connect {g} path_waiting {} tx_connections {}",
                    ep.path_waiting(),
                    ep.tx_count()
                );
            }
        }
        // The REQs of connections whose path arrived (this tool has no CM transport).
        while let Some((to, mad)) = ep.poll_mad() {
            if let Ok(CmMad {
                msg: CmMessage::Req(r),
                ..
            }) = CmMad::parse(&mad)
            {
                let p = r.primary_path;
                println!(
                    "req dgid {to} dlid {:#x} slid {:#x} sl {} subnet_local {} mtu {}",
                    p.remote_lid,
                    p.local_lid,
                    p.sl,
                    p.subnet_local,
                    r.path_mtu.map_or(0, |m| m.bytes()),
                );
            }
        }
        let failed = ep.counters().path_failed_drops;
        if failed > path_failed_drops {
            path_failed_drops = failed;
            println!("dropped path_failed_drops {failed}");
        }
        if rereg.swap(false, Ordering::Relaxed) {
            // As the verbs provider raises it: an async event the endpoint reads.
            println!("port event CLIENT_REREGISTER");
            v.raise_port_event(AsyncEvent::ClientReregister);
            ep.handle_verbs(now, &mut v);
        }
        // Checked after a pump that followed the leaves being asked for.
        if let Some(by) = leave_by {
            if sa.is_idle() {
                println!("stopped");
                return Ok(());
            }
            if now >= by {
                return Err(SaToolError::LeavesUnanswered);
            }
        }
        if stop.load(Ordering::Relaxed) && leave_by.is_none() {
            leave_by = Some(now + LEAVE_LIMIT);
            ep.leave_groups(&mut v);
        }
    }
}

/// An IPv6 UDP packet from `src` to `dst` with no payload.
fn udp6(src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
    let mut p = vec![0u8; 48];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&8u16.to_be_bytes());
    p[6] = 17;
    p[7] = 1;
    p[8..24].copy_from_slice(&src.octets());
    p[24..40].copy_from_slice(&dst.octets());
    p[40..42].copy_from_slice(&9u16.to_be_bytes());
    p[42..44].copy_from_slice(&9u16.to_be_bytes());
    p[44..46].copy_from_slice(&8u16.to_be_bytes());
    p
}
