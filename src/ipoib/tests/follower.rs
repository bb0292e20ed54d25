//! A follower endpoint (a worker other than 0 of an interface) on its own, with control's part
//! played by the test: what it asks of control, what waits on it and for how long, and what
//! it sends on connections of its own.

use std::sync::Arc;

use super::*;
use crate::soft::SoftVerbs;
use crate::wire::cm::{CmMad, CmMessage};
use crate::wire::{Gid, WorkerCount, WorkerId};

const PEER_IP: [u8; 4] = [198, 19, 0, 2];

/// Control's interface: its hardware address (UD QPN 0x100, node 1's GID) and CA GUID.
fn interface() -> Interface {
    Interface {
        hwaddr: HwAddr::new(
            HwAddr::FLAG_CONNECTED | HwAddr::FLAG_CONN_PER_WORKER,
            QpNum::new(0x100),
            Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 1)),
        ),
        ca_guid: 0xC0FF_EE00_0000_0001,
    }
}

/// A peer: a daemon of ours (`0x90`) or, with `many` false, one that takes one connection.
fn peer(many: bool) -> HwAddr {
    let flags = if many {
        HwAddr::FLAG_CONNECTED | HwAddr::FLAG_CONN_PER_WORKER
    } else {
        HwAddr::FLAG_CONNECTED
    };
    HwAddr::new(
        flags,
        QpNum::new(0x222),
        Gid::from(std::net::Ipv4Addr::new(198, 18, 0, 2)),
    )
}

/// Worker 1 of 2 on a provider of its own.
fn follower(t0: Instant) -> (Endpoint, SoftVerbs) {
    let two = WorkerCount::new(2).unwrap();
    let mut soft = SoftConfig::new(IpAddr::from([198, 18, 0, 1]));
    soft.workers = WorkerId::new(1, two).unwrap();
    let mut v = SoftVerbs::new(soft);
    v.handle_timeout(t0);
    let mut cfg = EndpointConfig::new(vec![(IpAddr::from([198, 19, 0, 1]), 24)]);
    cfg.worker = WorkerId::new(1, two).unwrap();
    let ep = Endpoint::new_follower(t0, &mut v, cfg, interface()).expect("follower");
    (ep, v)
}

fn to_peer(payload: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = etherparse::PacketBuilder::ipv4([198, 19, 0, 1], PEER_IP, 64)
        .udp(5000, 5001)
        .write(&mut out, &vec![7; payload]);
    out
}

fn view_of(ip: [u8; 4], hw: HwAddr) -> Arc<NeighView> {
    Arc::new([(IpAddr::from(ip), hw)].into_iter().collect())
}

fn asks(ep: &mut Endpoint) -> Vec<FollowerRequest> {
    std::iter::from_fn(|| ep.poll_to_control()).collect()
}

/// The REQs the follower's CM queued: their local QPNs and comm ids.
fn reqs(ep: &mut Endpoint) -> Vec<(QpNum, u32)> {
    std::iter::from_fn(|| ep.poll_mad())
        .filter_map(|(_, m)| match CmMad::parse(&m).ok()?.msg {
            CmMessage::Req(r) => Some((r.local_qpn, r.local_comm_id)),
            _ => None,
        })
        .collect()
}

/// A packet for a neighbour control has not named waits on the worker, and control is asked
/// once to resolve it; when the view names a peer of ours, the worker connects from a QP and
/// comm id tagged with its index, speaking as the interface, and the packets leave in order.
#[test]
fn a_packet_waits_for_its_neighbour_and_leaves_on_the_workers_connection() {
    let t0 = Instant::now();
    let (mut ep, mut v) = follower(t0);
    assert!(ep.is_follower());
    for len in [10, 20, 30] {
        ep.handle_tun_packet(t0, &mut v, &to_peer(len));
    }
    assert_eq!(
        asks(&mut ep),
        [FollowerRequest::Resolve(IpAddr::from(PEER_IP))]
    );
    assert!(
        reqs(&mut ep).is_empty(),
        "no REQ before the view names the peer"
    );

    ep.set_neighbour_view(t0, &mut v, view_of(PEER_IP, peer(true)));
    let sent = reqs(&mut ep);
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (qpn, comm_id) = sent[0];
    let two = WorkerCount::new(2).unwrap();
    assert_eq!(two.owner_of_qpn(qpn), 1, "{qpn:?}");
    assert_eq!(two.owner(comm_id), 1, "{comm_id:#x}");
    let queued: Vec<usize> = ep.tx.iter().map(|(_, c)| c.queue.len()).collect();
    assert_eq!(
        queued,
        [3],
        "the three packets wait on the connection, in order"
    );
    // Sent to: control hears of it for the neighbour's ageing.
    let mut used = Vec::new();
    ep.handle_tun_packet(t0, &mut v, &to_peer(40));
    ep.take_used_neighbours(&mut used);
    assert_eq!(used, [IpAddr::from(PEER_IP)]);
    // The hardware address of its REQs' private data is the interface's UD QPN.
    assert_eq!(ep.hwaddr(), interface().hwaddr);
}

/// Multicast, and a peer that takes one connection, go to control to send; nothing
/// connects from the worker.
#[test]
fn control_sends_what_the_worker_does_not() {
    let t0 = Instant::now();
    let (mut ep, mut v) = follower(t0);
    ep.set_neighbour_view(t0, &mut v, view_of(PEER_IP, peer(false)));
    let unicast = to_peer(10);
    ep.handle_tun_packet(t0, &mut v, &unicast);
    let mut mcast = Vec::new();
    let _ = etherparse::PacketBuilder::ipv4([198, 19, 0, 1], [224, 0, 0, 251], 1)
        .udp(5353, 5353)
        .write(&mut mcast, &[1, 2, 3]);
    ep.handle_tun_packet(t0, &mut v, &mcast);
    assert_eq!(
        asks(&mut ep),
        [
            FollowerRequest::Packet(unicast),
            FollowerRequest::Packet(mcast)
        ]
    );
    assert!(reqs(&mut ep).is_empty());
}

/// At most [`FOLLOWER_WAIT_MAX`] packets wait, each at most [`FOLLOWER_WAIT`]; what is
/// dropped is counted.
#[test]
fn what_waits_on_a_worker_is_bounded() {
    let t0 = Instant::now();
    let (mut ep, mut v) = follower(t0);
    for _ in 0..FOLLOWER_WAIT_MAX + 10 {
        ep.handle_tun_packet(t0, &mut v, &to_peer(10));
    }
    assert_eq!(ep.counters().tx_queue_drops, 10);
    assert_eq!(asks(&mut ep).len(), 1, "one request for one neighbour");
    let due = ep.poll_timeout().expect("the wait has a deadline");
    assert!(due <= t0 + FOLLOWER_WAIT, "{:?}", due - t0);
    ep.handle_timeout(t0 + FOLLOWER_WAIT, &mut v);
    assert_eq!(ep.counters().tx_dropped, FOLLOWER_WAIT_MAX as u64);
    // A view that names the peer now finds nothing waiting.
    ep.set_neighbour_view(t0 + FOLLOWER_WAIT, &mut v, view_of(PEER_IP, peer(true)));
    assert!(reqs(&mut ep).is_empty());
}

/// A view that no longer names a peer closes the worker's connection to it: a follower has no
/// neighbour table of its own to age it.
#[test]
fn a_peer_gone_from_the_view_loses_the_workers_connection() {
    let t0 = Instant::now();
    let (mut ep, mut v) = follower(t0);
    ep.set_neighbour_view(t0, &mut v, view_of(PEER_IP, peer(true)));
    ep.handle_tun_packet(t0, &mut v, &to_peer(10));
    assert_eq!(reqs(&mut ep).len(), 1);
    assert_eq!(ep.tx_count(), 1);
    ep.set_neighbour_view(t0, &mut v, Arc::new(NeighView::default()));
    let open = ep
        .tx
        .iter()
        .filter(|(_, c)| c.state != TxState::Closing)
        .count();
    assert_eq!(open, 0, "closed");
}

/// A worker's connection that fails (here a REJ) makes control resolve the peer's neighbours
/// again, as a failure of its own connection would.
#[test]
fn a_failed_connection_is_reported_to_control() {
    use crate::wire::cm::{Rej, RejReason, TargetMsg};
    let t0 = Instant::now();
    let (mut ep, mut v) = follower(t0);
    ep.set_neighbour_view(t0, &mut v, view_of(PEER_IP, peer(true)));
    ep.handle_tun_packet(t0, &mut v, &to_peer(10));
    let (_, comm_id) = reqs(&mut ep)[0];
    let rej = Rej {
        local_comm_id: 0x77,
        remote_comm_id: comm_id,
        msg_rejected: TargetMsg::Req,
        reason: RejReason::NoQp,
        ..Rej::default()
    };
    let mad = CmMad::new(1, CmMessage::Rej(rej)).emit();
    ep.handle_mad(t0, peer(true).gid, &mad);
    ep.handle_verbs(t0, &mut v);
    assert_eq!(ep.counters().tx_failed, 1);
    assert_eq!(asks(&mut ep), [FollowerRequest::Failed(peer(true))]);
}

/// Where control's paths come from an SA (a native InfiniBand port), a worker's connection
/// waits for its peer's path in control's view: a packet for a neighbour named without one
/// waits (control asked to resolve it, which asks the SA), and the REQ leaves with the path's
/// LIDs and SL once the view has it. A path that moves to another LID closes the connection
/// (the next packet connects on the new one), as `LID_CHANGE` on the worker's port closes them
/// all.
#[test]
fn on_an_sa_port_a_workers_connection_waits_for_its_path_from_control() {
    use crate::verbs::{AsyncEvent, Lid, Path, PathMtu, Sl};
    let t0 = Instant::now();
    let (mut ep, mut v) = follower(t0);
    let hw = peer(true);
    let named = |paths: Vec<(Gid, Path)>| {
        let view: NeighView = [(IpAddr::from(PEER_IP), hw)].into_iter().collect();
        Arc::new(view.with_paths(paths))
    };
    let path_at = |dlid: u16| Path {
        dlid: Lid(dlid),
        slid: Lid(0x11),
        sl: Sl::from_bits(3),
        // Inside the subnet: no GRH, the REQ names the LIDs.
        hop_limit: 0,
        ..Path::roce(interface().hwaddr.gid, hw.gid, PathMtu::Mtu2048)
    };
    let primary = |ep: &mut Endpoint| -> Vec<(u16, u16, u8)> {
        std::iter::from_fn(|| ep.poll_mad())
            .filter_map(|(_, m)| match CmMad::parse(&m).ok()?.msg {
                CmMessage::Req(r) => Some((
                    r.primary_path.local_lid,
                    r.primary_path.remote_lid,
                    r.primary_path.sl,
                )),
                _ => None,
            })
            .collect()
    };
    let open = |ep: &Endpoint| {
        ep.tx
            .iter()
            .filter(|(_, c)| c.state != TxState::Closing)
            .count()
    };

    ep.set_neighbour_view(t0, &mut v, named(Vec::new()));
    ep.handle_tun_packet(t0, &mut v, &to_peer(10));
    assert_eq!(
        asks(&mut ep),
        [FollowerRequest::Resolve(IpAddr::from(PEER_IP))]
    );
    assert!(primary(&mut ep).is_empty(), "no REQ without the path");
    assert_eq!(ep.tx_count(), 0);

    ep.set_neighbour_view(t0, &mut v, named(vec![(hw.gid, path_at(0x21))]));
    assert_eq!(
        primary(&mut ep),
        [(0x11, 0x21, 3)],
        "the path's LIDs and SL"
    );
    let queued: Vec<usize> = ep.tx.iter().map(|(_, c)| c.queue.len()).collect();
    assert_eq!(queued, [1], "the packet that waited, on the connection");

    // The SM moved the peer: the connection on the old LID closes, the next packet opens one
    // on the new path.
    ep.set_neighbour_view(t0, &mut v, named(vec![(hw.gid, path_at(0x22))]));
    assert_eq!(open(&ep), 0, "closed on the moved path");
    ep.handle_tun_packet(t0, &mut v, &to_peer(20));
    assert_eq!(primary(&mut ep), [(0x11, 0x22, 3)]);
    assert_eq!(open(&ep), 1);

    // A port event voids control's paths: the view drops them, the open connection stays.
    ep.set_neighbour_view(t0, &mut v, named(Vec::new()));
    assert_eq!(open(&ep), 1, "a path forgotten closes nothing");
    assert_eq!(ep.path(hw.gid), None);

    // Our own LID changed: every connection of the worker closes.
    v.raise_port_event(AsyncEvent::LidChange);
    ep.handle_verbs(t0, &mut v);
    assert_eq!(open(&ep), 0, "closed on LID_CHANGE");
}
