//! The endpoint on the kernel's CM (`--cm-transport rdmacm`), driven by a fake kernel: the
//! test takes the endpoints' [`KcmCommand`]s and answers with the [`KcmInput`]s `ib_cm` and
//! rdma_cm would give, QP moves included, while the QPs and the data run on the simulated
//! fabric. Transcripts: active connect, passive accept, reject, peer disconnect, device
//! removal.

use std::collections::HashMap;

use super::*;
use crate::cm::{CommId, KcmCommand, KcmInput, KcmTarget, LinkLayer, QpMoves, PASSIVE_ID_BASE};
use crate::verbs::setup::RcConnection;
use crate::verbs::{Gid, PathMtu, Psn, QpNum, Verbs};

/// Both ends of one connection: (node, id) of the active and the passive side.
#[derive(Debug, Clone, Copy)]
struct Link {
    active: (usize, CommId),
    passive: (usize, CommId),
    /// The active QP, and the PSNs each side's kernel id chose (`seq_num`).
    active_qpn: QpNum,
    active_psn: Psn,
    passive_psn: Psn,
}

/// The fake kernel of every node: commands in, inputs out, a log of both.
#[derive(Debug, Default)]
struct FakeKernel {
    links: Vec<Link>,
    next_passive: u32,
    log: Vec<String>,
    /// Nodes whose kernel answers every REQ with a REJ of this reason (no listener: 8).
    rejects: HashMap<usize, u16>,
    /// The target of every connect, by node.
    targets: Vec<(usize, KcmTarget)>,
    /// The retry counts of every REQ (node, transport, RNR) and REP (node, RNR).
    req_retries: Vec<(usize, u8, u8)>,
    rep_rnr_retries: Vec<(usize, u8)>,
}

fn gid(n: &mut Net, i: usize) -> Gid {
    n.f.nodes[i].port_attr().gid
}

fn moves(peer: Gid, peer_qpn: QpNum, own_psn: Psn, peer_psn: Psn) -> QpMoves {
    let c = RcConnection::new((peer, peer_qpn), PathMtu::Mtu1024, own_psn, peer_psn);
    QpMoves {
        rtr: c.rtr_attr(),
        rts: c.rts_attr(),
    }
}

impl FakeKernel {
    fn node_of(n: &mut Net, g: Gid) -> Option<usize> {
        (0..n.eps.len()).find(|&i| gid(n, i) == g)
    }

    fn link_of(&self, node: usize, id: CommId) -> Option<(usize, Link)> {
        self.links
            .iter()
            .position(|l| l.active == (node, id) || l.passive == (node, id))
            .map(|i| (i, self.links[i]))
    }

    fn feed(&mut self, n: &mut Net, node: usize, input: KcmInput) {
        self.log.push(format!("{node} <- {}", name_of(&input)));
        let now = n.now();
        n.ep(node).handle_kcm_input(now, input);
    }

    /// Executes every queued command of every node; true if there was one.
    fn pump(&mut self, n: &mut Net) -> bool {
        let mut any = false;
        for node in 0..n.eps.len() {
            while let Some(c) = n.ep(node).poll_kcm_command() {
                any = true;
                self.command(n, node, c);
            }
        }
        any
    }

    fn command(&mut self, n: &mut Net, node: usize, c: KcmCommand) {
        self.log.push(format!("{node} -> {}", cmd_name(&c)));
        let id = c.id();
        match c {
            KcmCommand::Connect {
                peer,
                target,
                qpn,
                private_data,
                retry_count,
                rnr_retry_count,
                ..
            } => {
                self.targets.push((node, target));
                self.req_retries.push((node, retry_count, rnr_retry_count));
                let Some(b) = Self::node_of(n, peer) else {
                    self.feed(n, node, KcmInput::Unreachable { id });
                    return;
                };
                if let Some(reason) = self.rejects.get(&b).copied() {
                    self.feed(n, node, KcmInput::Rejected { id, reason });
                    return;
                }
                self.next_passive += 1;
                let pid = CommId(PASSIVE_ID_BASE | self.next_passive);
                let link = Link {
                    active: (node, id),
                    passive: (b, pid),
                    active_qpn: qpn,
                    active_psn: Psn::new(0x1000 + self.next_passive),
                    passive_psn: Psn::new(0x2000 + self.next_passive),
                };
                self.links.push(link);
                let ga = gid(n, node);
                let mut m = moves(ga, qpn, link.passive_psn, link.active_psn);
                // The passive side's attributes carry the REQ's retry counts
                // (`cm_req_handler`), which is how the endpoint learns them.
                m.rts.retry_cnt = Some(retry_count);
                m.rts.rnr_retry = Some(rnr_retry_count);
                self.feed(
                    n,
                    b,
                    KcmInput::Request {
                        id: pid,
                        peer: ga,
                        remote_qpn: qpn,
                        private_data,
                        moves: m,
                    },
                );
            }
            KcmCommand::Accept {
                qpn,
                private_data,
                rnr_retry_count,
                ..
            } => {
                self.rep_rnr_retries.push((node, rnr_retry_count));
                let Some((_, l)) = self.link_of(node, id) else {
                    return;
                };
                let gb = gid(n, node);
                let mut m = moves(gb, qpn, l.active_psn, l.passive_psn);
                // The active side's QP retries RNR NAKs as the REP says (`cm_rep_handler`).
                m.rts.rnr_retry = Some(rnr_retry_count);
                let _ = l.active_qpn;
                self.feed(
                    n,
                    l.active.0,
                    KcmInput::Response {
                        id: l.active.1,
                        remote_qpn: qpn,
                        private_data,
                        moves: m,
                    },
                );
            }
            KcmCommand::Establish { .. } | KcmCommand::Notify { .. } => {
                if let Some((_, l)) = self.link_of(node, id) {
                    self.feed(n, l.passive.0, KcmInput::Established { id: l.passive.1 });
                }
            }
            KcmCommand::Reject { .. } | KcmCommand::Destroy { .. } => {
                if let Some((i, l)) = self.link_of(node, id) {
                    self.links.remove(i);
                    let other = if l.active == (node, id) {
                        l.passive
                    } else {
                        l.active
                    };
                    self.feed(
                        n,
                        other.0,
                        KcmInput::Rejected {
                            id: other.1,
                            reason: 28,
                        },
                    );
                }
            }
            KcmCommand::Disconnect { .. } => {
                if let Some((i, l)) = self.link_of(node, id) {
                    self.links.remove(i);
                    for (nd, cid) in [l.active, l.passive] {
                        self.feed(n, nd, KcmInput::Disconnected { id: cid });
                    }
                    for (nd, cid) in [l.active, l.passive] {
                        self.feed(n, nd, KcmInput::TimewaitExit { id: cid });
                    }
                }
            }
        }
    }

    /// Runs the cluster for `d`, executing commands every millisecond.
    fn run(&mut self, n: &mut Net, d: Duration) {
        let steps = d.as_millis().max(1);
        for _ in 0..steps {
            n.run(Duration::from_millis(1));
            while self.pump(n) {
                n.service();
            }
        }
    }
}

fn name_of(i: &KcmInput) -> &'static str {
    match i {
        KcmInput::Request { .. } => "request",
        KcmInput::Response { .. } => "response",
        KcmInput::Established { .. } => "established",
        KcmInput::Rejected { .. } => "rejected",
        KcmInput::Unreachable { .. } => "unreachable",
        KcmInput::Disconnected { .. } => "disconnected",
        KcmInput::TimewaitExit { .. } => "timewait-exit",
        KcmInput::DeviceRemoval { .. } => "device-removal",
    }
}

fn cmd_name(c: &KcmCommand) -> &'static str {
    match c {
        KcmCommand::Connect { .. } => "connect",
        KcmCommand::Accept { .. } => "accept",
        KcmCommand::Reject { .. } => "reject",
        KcmCommand::Establish { .. } => "establish",
        KcmCommand::Disconnect { .. } => "disconnect",
        KcmCommand::Destroy { .. } => "destroy",
        KcmCommand::Notify { .. } => "notify",
    }
}

fn kernel_cm_on(c: &mut EndpointConfig, link: LinkLayer) {
    c.kernel_cm = Some(KernelCmConfig {
        max_ids: 64,
        // RDMA_PS_IB port 4793.
        service_id: 0x013F_12B9,
        link,
    });
}

fn kernel_cm(_: usize, c: &mut EndpointConfig) {
    kernel_cm_on(c, LinkLayer::Ethernet);
}

fn kernel_cm_ib(_: usize, c: &mut EndpointConfig) {
    kernel_cm_on(c, LinkLayer::InfiniBand);
}

/// Two kernel-CM nodes, node 0 connected to node 1 by one ping.
fn connected() -> (Net, FakeKernel) {
    connected_with(kernel_cm)
}

/// [`connected`] with the nodes' configuration `cfg`.
fn connected_with(cfg: fn(usize, &mut EndpointConfig)) -> (Net, FakeKernel) {
    let mut n = Net::new(2, |_, _| {}, cfg);
    let mut k = FakeKernel::default();
    let p = ping4(0, 1, 100);
    n.inject(0, &p);
    k.run(&mut n, Duration::from_millis(50));
    assert_eq!(n.tun[1], vec![p], "{:?}", k.log);
    (n, k)
}

/// Every connectable node of ours takes a connection per sending worker.
const MANY: u8 = HwAddr::FLAG_CONN_PER_WORKER;

#[test]
fn the_hardware_address_says_the_cm_is_the_kernels() {
    let mut n = Net::new(1, |_, _| {}, kernel_cm);
    let hw = n.ep(0).hwaddr();
    assert_eq!(
        hw.flags,
        HwAddr::FLAG_CONNECTED | HwAddr::FLAG_RDMA_CM | MANY
    );
    assert!(n.ep(0).kernel_cm());
}

/// On InfiniBand `0x80` goes (kernel ipoib peers then use UD datagrams), `0x20` stays; on RoCE
/// both stay; a datagram-mode or our-CM endpoint is as before.
#[test]
fn the_hardware_address_flags_follow_the_link_layer() {
    let mut n = Net::new(1, |_, _| {}, kernel_cm_ib);
    assert_eq!(n.ep(0).hwaddr().flags, HwAddr::FLAG_RDMA_CM | MANY);
    assert!(
        n.ep(0).hwaddr().connectable(),
        "our daemons still connect to it"
    );
    let mut c = EndpointConfig::new(Vec::new());
    let flags = |c: &EndpointConfig| c.hwaddr_flags();
    assert_eq!(flags(&c), HwAddr::FLAG_CONNECTED | MANY);
    c.advertise_rdma_cm = true;
    assert_eq!(
        flags(&c),
        HwAddr::FLAG_CONNECTED | HwAddr::FLAG_RDMA_CM | MANY
    );
    c.advertise_rdma_cm = false;
    kernel_cm_on(&mut c, LinkLayer::Ethernet);
    assert_eq!(
        flags(&c),
        HwAddr::FLAG_CONNECTED | HwAddr::FLAG_RDMA_CM | MANY
    );
    kernel_cm_on(&mut c, LinkLayer::InfiniBand);
    assert_eq!(flags(&c), HwAddr::FLAG_RDMA_CM | MANY);
    c.mode = Mode::Datagram;
    assert_eq!(flags(&c), HwAddr::FLAG_RDMA_CM | MANY);
    kernel_cm_on(&mut c, LinkLayer::Ethernet);
    assert_eq!(flags(&c), HwAddr::FLAG_RDMA_CM | MANY);
}

/// Two kernel-CM daemons on InfiniBand: both advertise `0x20`, so the connection goes to the
/// rdma_cm port (not `AF_IB`) and carries data though neither has `0x80`.
#[test]
fn on_infiniband_a_peer_with_the_flag_is_reached_at_its_rdma_cm_port() {
    let (mut n, k) = connected_with(kernel_cm_ib);
    assert_eq!(k.targets, [(0, KcmTarget::RdmaCmPort)]);
    assert_eq!(n.ep(0).counters().tx_established, 1);
}

/// A kernel-CM daemon on InfiniBand towards a peer without `0x20` (here our CM; kernel
/// `ipoib_cm` alike): `AF_IB` at its standard service ID, with raw `ipoib_cm_data`. Where that
/// draws REJ 8 (a kernel-CM daemon whose flag was lost), the retry goes to the rdma_cm port.
/// On RoCE both go to the rdma_cm port, as before.
#[test]
fn on_infiniband_a_peer_without_the_flag_is_reached_through_af_ib_at_its_standard_service() {
    for (link, first) in [
        (LinkLayer::InfiniBand, None),
        (LinkLayer::Ethernet, Some(KcmTarget::RdmaCmPort)),
    ] {
        let mut n = Net::new(
            2,
            |_, _| {},
            |i, c| {
                if i == 0 {
                    kernel_cm_on(c, link);
                }
            },
        );
        let peer = n.ep(1).hwaddr();
        assert_eq!(peer.flags, HwAddr::FLAG_CONNECTED | MANY);
        let sid = crate::wire::cm::ipoib_service_id(peer.qpn, true);
        let first = first.unwrap_or(KcmTarget::IbService {
            service_id: sid,
            pkey: 0xffff,
        });
        let mut k = FakeKernel::default();
        k.rejects.insert(1, 8);
        n.inject(0, &ping4(0, 1, 64));
        k.run(&mut n, Duration::from_millis(20));
        assert_eq!(
            k.targets,
            [(0, first), (0, KcmTarget::RdmaCmPort)],
            "{link:?}: {:?}",
            k.log
        );
        let c = n.ep(0).counters();
        assert_eq!((c.tx_rdma_cm_retries, c.tx_failed), (1, 1), "{link:?}");
        let req = k
            .log
            .iter()
            .filter(|l| l.as_str() == "0 -> connect")
            .count();
        assert_eq!(req, 2);
    }
}

#[test]
fn an_active_connect_and_a_passive_accept_carry_data_with_the_kernels_psns() {
    let (mut n, k) = connected();
    assert_eq!(
        k.log,
        [
            "0 -> connect",
            "1 <- request",
            "1 -> accept",
            "0 <- response",
            "0 -> establish",
            "1 <- established",
        ]
    );
    assert_eq!(n.ep(0).counters().tx_established, 1);
    assert_eq!(n.ep(1).counters().rx_accepted, 1);
    // The ping back crosses too (node 1's own TX connection, the same transcript mirrored).
    let mut k = k;
    let back = ping6(1, 0, 3000);
    n.inject(1, &back);
    k.run(&mut n, Duration::from_millis(50));
    assert_eq!(n.tun[0], vec![back]);
    assert_eq!(n.ep(1).counters().tx_established, 1);
    // No MAD of ours left either node.
    for i in 0..2 {
        assert_eq!(n.ep(i).cm_stats().mads_sent, 0);
        assert_eq!(n.ep(i).poll_mad(), None);
    }
}

#[test]
fn a_rejected_connect_fails_the_tx_connection_and_destroys_its_qp() {
    let mut n = Net::new(2, |_, _| {}, kernel_cm);
    let mut k = FakeKernel::default();
    k.rejects.insert(1, 8);
    let before = n.qp_live(0);
    n.inject(0, &ping4(0, 1, 64));
    k.run(&mut n, Duration::from_millis(20));
    assert_eq!(k.log, ["0 -> connect", "0 <- rejected"]);
    let c = n.ep(0).counters();
    assert_eq!((c.tx_failed, c.tx_established), (1, 0));
    assert_eq!(n.ep(0).tx_count(), 0);
    assert_eq!(n.qp_live(0), before, "the TX QP is gone");
    let mut rejected = false;
    while let Some(e) = n.ep(0).poll_event() {
        rejected |= matches!(
            e,
            Event::TxFailed {
                reason: TxFailure::Rejected,
                ..
            }
        );
    }
    assert!(rejected);
}

#[test]
fn a_peer_disconnect_reaps_the_rx_qp_and_closes_the_tx_side() {
    let (mut n, mut k) = connected();
    let (qp0, qp1) = (n.qp_live(0), n.qp_live(1));
    // Node 0 ends its TX connection (shutdown): the kernel sends the DREQ, node 1 reaps.
    let now = n.now();
    let (ep, v) = (n.0.eps[0].as_mut().unwrap(), &mut n.0.f.nodes[0]);
    ep.begin_shutdown(now, v);
    k.run(&mut n, Duration::from_millis(50));
    assert!(k.log.iter().any(|l| l == "0 -> disconnect"), "{:?}", k.log);
    assert_eq!(n.ep(1).rx_count(), 0, "{:?}", k.log);
    assert_eq!(n.ep(1).counters().rx_dreq_reaped, 1);
    assert_eq!(n.qp_live(1), qp1 - 1, "the RX QP is destroyed");
    assert_eq!(n.qp_live(0), qp0 - 1, "the TX QP is destroyed");
    assert!(n.ep(0).is_stopped());
    // TimeWait over on both: the ids are gone from the owner maps.
    assert!(n.ep(0).owners.is_empty() && n.ep(1).owners.is_empty());
}

#[test]
fn a_device_removal_reaps_both_sides() {
    let (mut n, mut k) = connected();
    let l = k.links[0];
    let qp1 = n.qp_live(1);
    let now = n.now();
    n.ep(1)
        .handle_kcm_input(now, KcmInput::DeviceRemoval { id: l.passive.1 });
    n.ep(0)
        .handle_kcm_input(now, KcmInput::DeviceRemoval { id: l.active.1 });
    k.run(&mut n, Duration::from_millis(50));
    assert_eq!(n.ep(1).rx_count(), 0);
    assert_eq!(n.qp_live(1), qp1 - 1);
    assert_eq!(n.ep(0).tx_count(), 0);
    assert!(n.ep(0).owners.is_empty() && n.ep(1).owners.is_empty());
    // Nothing of the removed ids went back to the kernel.
    assert!(
        !k.log.iter().any(|l| l.contains("-> disconnect")),
        "{:?}",
        k.log
    );
}

/// A sender configured as Linux's (`ipoib_cm_send_req`: `retry_count` 0, `rnr_retry_count` 0).
fn linux_sender(i: usize, c: &mut EndpointConfig) {
    kernel_cm(i, c);
    if i == 0 {
        c.tx_retry_count = 0;
        c.tx_rnr_retry = 0;
    }
}

#[test]
fn the_req_carries_the_senders_retries_and_the_rep_echoes_its_rnr_retries() {
    let (_n, k) = connected_with(linux_sender);
    // Node 0's REQ says what it was configured with; node 1's REP gives the same RNR retries
    // back for node 0's QP, as Linux's `ipoib_cm_send_rep` does.
    assert_eq!(k.req_retries, vec![(0, 0, 0)], "{:?}", k.log);
    assert_eq!(k.rep_rnr_retries, vec![(1, 0)], "{:?}", k.log);
    let (_n, k) = connected();
    assert_eq!(k.req_retries, vec![(0, 7, 7)], "{:?}", k.log);
    assert_eq!(k.rep_rnr_retries, vec![(1, 7)], "{:?}", k.log);
}
