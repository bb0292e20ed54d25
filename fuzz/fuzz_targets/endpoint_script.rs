//! Two or three IPoIB-CM `Endpoint`s on the simulated fabric (`sim::Fabric`, virtual clock),
//! driven by a script: the "no QP ever leaks" property.
//!
//! The input is a sequence of chunks `[tag: u8][len: u16 LE][body: len bytes]`. The first
//! chunk's body is the set-up (`Setup`, decoded with `arbitrary`; short means defaults): two or
//! three nodes, and per node the provider's `Quirks`, its transmit faults (loss, duplication,
//! reordering, corruption, each 0–20 %), SRQ or per-QP rings, `max_conn_qp` 1–4, the budget
//! policy, `rx_timeout` 1–5 s, flag 0x20 advertised or not, and the standard service IDs
//! listened on or not (a stand-in for a daemon on the kernel's CM, reached only at the rdma_cm
//! service); `drain_timeout` is 1 s and `neigh_timeout` 3 s. Every later
//! chunk is one step, picked by `tag % 9`:
//!
//! - an IP packet into a node's TUN device: a ping (IPv4 or IPv6, built with etherparse, up to
//!   the largest IP packet, so also beyond the connection MTU) to a node, to itself, to an
//!   address nobody has, or to multicast / broadcast; or raw bytes;
//! - kill a node (partition it and drop its endpoint, as after SIGKILL);
//! - restart a node (a new `SoftVerbs` on the same address, a new `Endpoint`);
//! - `begin_shutdown`, and `force_stop` of a node that is shutting down;
//! - let virtual time pass (0–65 s), running the fabric and every endpoint;
//! - a raw datagram into a node's `handle_datagram` (optionally with a valid ICRC), or a
//!   well-formed RoCEv2 packet aimed at one of its real QPs (UD QP, QP1, an RX or TX RC QP)
//!   from a real peer's address, carrying an IPoIB frame, a CM MAD (a REQ at the rdma_cm
//!   or the standard service with a valid, a wrong or no `cma_hdr` among them) or raw bytes.
//!
//! Invariants: no panic; at any time, on every live node, `counters().qp_created -
//! counters().qp_destroyed == qp_count()` and `qp_count() == 2 + rx_count() + tx_count()` (the
//! UD QP and QP1, plus one QP per connection: a QP the endpoint forgot is a leak); right after
//! `Endpoint::new`, `qp_count() == 2`; after `begin_shutdown` ("no new connections") the node
//! creates no QP (`EP_FUZZ_NO_SHUTDOWN_CHECK=1` turns this one check off); after every step,
//! at most `max_conn_qp` RX connections are live and at most one TX connection per peer is
//! open. After a final quiet phase (no input; `QUIET` of virtual
//! time, past rx_timeout + drain_timeout + the CM's retries and TimeWait + neighbour ageing),
//! every live node has `rx_count() == 0`, `tx_count() == 0` and `qp_count() == 2`, every
//! node that began shutting down is stopped, and every node that did not has as many receive
//! buffers posted (SRQ, UD QP, QP1) as right after `Endpoint::new` (none lost).
//!
//! `EP_FUZZ_TRACE=1` prints every step, the nodes' state after it, and the final counters.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use etherparse::PacketBuilder;
use ipoib_cm::ipoib::{
    Endpoint, EndpointConfig, Mode, QpBudgetPolicy, RxState, TxState, DEFAULT_RDMA_CM_PORT,
};
use ipoib_cm::mad::{self, Gsi, Mad, MadTransport};
use ipoib_cm::sim::{self, Fabric};
use ipoib_cm::soft::{FaultConfig, Quirks, SoftVerbs};
use ipoib_cm::verbs::{Gid, PathMtu, QpNum, Verbs};
use ipoib_cm::wire::cm::{
    ipoib_service_id, CmMad, CmMessage, CmPath, Dreq, IpoibCmData, Rej, RejReason, Req, Rtu,
    TargetMsg, MAD_LEN,
};
use ipoib_cm::wire::cma::{CmaHdr, PortSpace};
use ipoib_cm::wire::{
    compute_icrc, Aeth, Bth, Deth, ImmDt, IpHeaderInfo, Opcode, Reth, RoceRepr, Syndrome, GSI_QKEY,
    ICRC_LEN, ROCEV2_UDP_PORT,
};
use libfuzzer_sys::fuzz_target;

const MAX_OPS: usize = 64;
/// The endpoint's UD QP and QP1 of the node's CM MAD transport.
const BASELINE_QPS: usize = 2;
/// The final quiet phase.
const QUIET: Duration = Duration::from_secs(120);
/// Most loop turns of one `run` (a turn handles at least one event or 1 µs).
const RUN_TURNS: usize = 1_000_000;
const UD_QKEY: u32 = 0x0B1B;

fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("EP_FUZZ_TRACE").is_some())
}

/// `EP_FUZZ_NO_SHUTDOWN_CHECK=1` turns off the "no QP created after `begin_shutdown`" check,
/// to look for other failures while that known one stands.
fn shutdown_check() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("EP_FUZZ_NO_SHUTDOWN_CHECK").is_none())
}

macro_rules! tr {
    ($($a:tt)*) => { if trace() { eprintln!($($a)*); } };
}

fn v4(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 0, i as u8 + 1)
}

fn v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, 0, 0, 0, i as u16 + 1)
}

/// The fabric (underlay) address of node `i` (as `Fabric::with_nodes` numbers them).
fn underlay(i: usize) -> IpAddr {
    IpAddr::from([198, 18, 0, i as u8 + 1])
}

#[derive(Arbitrary, Debug, Default, Clone)]
struct NodeSetup {
    drain_never: bool,
    no_last_wqe: bool,
    dup_last_wqe: bool,
    last_wqe_again: bool,
    clean_cq_on_destroy: bool,
    moves_later: bool,
    loss: u8,
    dup: u8,
    reorder: u8,
    corrupt: u8,
    fault_seed: u8,
    no_srq: bool,
    max_conn_qp: u8,
    reject_policy: bool,
    rx_timeout: u8,
    /// Advertise flag 0x20 (`advertise_rdma_cm`).
    advertise_rdma_cm: bool,
    /// Listen on the rdma_cm service only, as a daemon on the kernel's CM
    /// (`listen_ipoib_service = false`).
    rdma_cm_only: bool,
}

#[derive(Arbitrary, Debug, Default)]
struct Setup {
    three: bool,
    nodes: [NodeSetup; 3],
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum DstSel {
    Node(u8),
    Unknown,
    Multicast,
}

#[derive(Arbitrary, Debug)]
enum TunSpec {
    Ping4 {
        to: DstSel,
        len: u16,
    },
    Ping6 {
        to: DstSel,
        len: u16,
    },
    /// The rest of the body, as it is.
    Raw,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum QpSel {
    Ud,
    Gsi,
    Rx(u8),
    Tx(u8),
    Multicast,
    Other(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum PayloadSel {
    /// IPoIB header (IPv4, IPv6, ARP or a raw ethertype) and the rest of the body.
    Ipoib(u8),
    /// A CM MAD crafted around comm ids taken from the body, or the body as a MAD.
    Mad(u8),
    Raw,
}

/// A well-formed RoCEv2 packet for node `node` from node `from`'s address.
#[derive(Arbitrary, Debug)]
struct RoceSpec {
    node: u8,
    from: u8,
    qp: QpSel,
    opcode: u8,
    psn: u32,
    ack_req: bool,
    syndrome: u8,
    msn: u32,
    right_qkey: bool,
    qkey: u32,
    src_qp: u32,
    payload: PayloadSel,
}

struct Node {
    setup: NodeSetup,
    ep: Option<Endpoint>,
    /// The CM MAD transport (QP1) the node's driver owns; `None` while `ep` is.
    mad: Option<Gsi>,
    /// `begin_shutdown` was called; `qp_created` at that moment.
    stopping: bool,
    created_at_stop: u64,
    /// Receive buffers posted (SRQ, UD QP, QP1) right after `Endpoint::new`.
    posted_at_boot: usize,
    incarnation: u64,
}

struct Net {
    f: Fabric,
    nodes: Vec<Node>,
    start: Instant,
    tun_packets: u64,
    mad_scratch: Vec<Mad>,
}

fn ping4(src: Ipv4Addr, dst: Ipv4Addr, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
        .icmpv4_echo_request(7, 1)
        .write(&mut out, &vec![0xA5; len])
        .expect("ping4");
    out
}

fn ping6(src: Ipv6Addr, dst: Ipv6Addr, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ipv6(src.octets(), dst.octets(), 64)
        .icmpv6_echo_request(7, 1)
        .write(&mut out, &vec![0x5A; len])
        .expect("ping6");
    out
}

/// The opcodes a packet may carry (the ones the engine supports).
fn opcodes() -> &'static [Opcode] {
    static OPS: OnceLock<Vec<Opcode>> = OnceLock::new();
    OPS.get_or_init(|| {
        Opcode::ALL_KNOWN
            .iter()
            .copied()
            .filter(|o| o.is_supported())
            .collect()
    })
}

impl Net {
    fn new(s: &Setup, start: Instant) -> Self {
        let n = if s.three { 3 } else { 2 };
        let f = Fabric::with_nodes(n, start, |i, c| {
            let ns = &s.nodes[i];
            c.quirks = Quirks {
                drain_never: ns.drain_never,
                no_last_wqe: ns.no_last_wqe,
                dup_last_wqe: ns.dup_last_wqe,
                last_wqe_again: ns.last_wqe_again,
                clean_cq_on_destroy: ns.clean_cq_on_destroy,
                moves_later: ns.moves_later,
            };
            c.faults = FaultConfig {
                loss_pct: f64::from(ns.loss % 21),
                dup_pct: f64::from(ns.dup % 21),
                reorder_pct: f64::from(ns.reorder % 21),
                corrupt_pct: f64::from(ns.corrupt % 21),
                seed: u64::from(ns.fault_seed) + 1,
                device_fatal_after: None,
            };
        });
        let mut net = Self {
            f,
            nodes: s.nodes[..n]
                .iter()
                .map(|ns| Node {
                    setup: ns.clone(),
                    ep: None,
                    mad: None,
                    stopping: false,
                    created_at_stop: 0,
                    posted_at_boot: 0,
                    incarnation: 0,
                })
                .collect(),
            start,
            tun_packets: 0,
            mad_scratch: Vec::new(),
        };
        for i in 0..n {
            net.boot(i);
        }
        net
    }

    fn now(&self) -> Instant {
        self.f.now()
    }

    fn config(&self, i: usize) -> EndpointConfig {
        let ns = &self.nodes[i].setup;
        let mut c = EndpointConfig::new(vec![(IpAddr::V4(v4(i)), 24), (IpAddr::V6(v6(i)), 64)]);
        c.mode = Mode::Connected;
        c.srq = !ns.no_srq;
        c.max_conn_qp = usize::from(ns.max_conn_qp % 4) + 1;
        c.budget_policy = if ns.reject_policy {
            QpBudgetPolicy::Reject
        } else {
            QpBudgetPolicy::Evict
        };
        c.rx_timeout = Duration::from_secs(u64::from(ns.rx_timeout % 5) + 1);
        c.drain_timeout = Duration::from_secs(1);
        c.neigh_timeout = Duration::from_secs(3);
        // Small rings keep an execution cheap (and make RNR likely).
        c.srq_depth = 16;
        c.nonsrq_ring = 4;
        c.tx_depth = 16;
        c.ud_depth = 16;
        c.seed = (i as u64 + 1) << 32 | self.nodes[i].incarnation;
        c.advertise_rdma_cm = ns.advertise_rdma_cm;
        c.listen_ipoib_service = !ns.rdma_cm_only;
        c
    }

    /// A fresh provider and endpoint on node `i`.
    fn boot(&mut self, i: usize) {
        let now = self.now();
        self.f.partitioned[i] = false;
        let cfg = *self.f.nodes[i].config();
        self.f.nodes[i] = SoftVerbs::new(cfg);
        let peers: Vec<IpAddr> = (0..self.nodes.len()).map(underlay).collect();
        self.f.nodes[i].set_mcast_peers(peers);
        let c = self.config(i);
        // Endpoint::new announces the node (a gratuitous ARP or unsolicited NA per address,
        // `ud_depth` send buffers being plenty): those sends are posted until they complete.
        let announcements = c.addrs.len().min(c.ud_depth as usize);
        let gsi = Gsi::open_for_cm(&mut self.f.nodes[i]).expect("QP1");
        let qp1 = MadTransport::<SoftVerbs>::provider_qp(&gsi);
        let ep = Endpoint::new(now, &mut self.f.nodes[i], c, qp1).expect("Endpoint::new");
        assert_eq!(
            self.f.nodes[i].qp_count(),
            BASELINE_QPS,
            "node {i}: baseline"
        );
        let posted = self.f.nodes[i].pools().posted_count() - announcements;
        let n = &mut self.nodes[i];
        n.posted_at_boot = posted;
        n.ep = Some(ep);
        n.mad = Some(gsi);
        n.stopping = false;
        n.incarnation += 1;
    }

    fn node(&self, n: u8) -> usize {
        usize::from(n) % self.nodes.len()
    }

    /// Lets every endpoint handle MADs, verbs and timers and consumes TUN output.
    fn service(&mut self) {
        let now = self.f.now();
        for i in 0..self.nodes.len() {
            let n = &mut self.nodes[i];
            if let (Some(ep), Some(gsi)) = (n.ep.as_mut(), n.mad.as_mut()) {
                let v = &mut self.f.nodes[i];
                sim::endpoint_turn(ep, gsi, v, &mut self.mad_scratch, now);
                while ep.poll_tun(v).is_some() {
                    self.tun_packets += 1;
                }
            }
        }
    }

    /// Runs for `d` of virtual time (the approach of the endpoint's own tests).
    fn run(&mut self, d: Duration) {
        let end = self.f.now() + d;
        for _ in 0..RUN_TURNS {
            self.service();
            self.f.transmit();
            let mut next = self.f.next_event();
            for ep in self.nodes.iter().filter_map(|n| n.ep.as_ref()) {
                next = match (next, ep.poll_timeout()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            let now = self.f.now();
            let target = next.unwrap_or(end).max(now).min(end);
            if target >= end && now >= end {
                self.service();
                self.check();
                return;
            }
            let step = target
                .saturating_duration_since(now)
                .max(Duration::from_micros(1));
            self.f.advance(step);
            self.check();
        }
        panic!("run({d:?}) did not reach its end in {RUN_TURNS} turns");
    }

    fn check(&self) {
        for (i, n) in self.nodes.iter().enumerate() {
            let Some(ep) = n.ep.as_ref() else { continue };
            let c = ep.counters();
            let qps = self.f.nodes[i].qp_count();
            assert_eq!(
                (c.qp_created - c.qp_destroyed) as usize,
                qps,
                "node {i}: created {} - destroyed {} != qp_count {qps}",
                c.qp_created,
                c.qp_destroyed
            );
            assert_eq!(
                qps,
                BASELINE_QPS + ep.rx_count() + ep.tx_count(),
                "node {i}: {qps} QPs for {} RX and {} TX connections",
                ep.rx_count(),
                ep.tx_count()
            );
            if n.stopping && shutdown_check() {
                assert_eq!(
                    c.qp_created, n.created_at_stop,
                    "node {i}: a QP was created after begin_shutdown (no new connections)"
                );
            }
        }
    }

    fn summary(&self) {
        for (i, n) in self.nodes.iter().enumerate() {
            match n.ep.as_ref() {
                Some(ep) => {
                    let s = ep.snapshot(self.now());
                    let c = s.counters;
                    eprintln!(
                        "  node {i}{}: qps {} rx {:?} tx {:?} (QPs +{} -{}, tx est {} failed {}, \
                         rx acc {} pkts in {} out {})",
                        if n.stopping { " (stopping)" } else { "" },
                        self.f.nodes[i].qp_count(),
                        s.rx.iter().map(|r| (r.1, r.2)).collect::<Vec<_>>(),
                        s.tx.iter().map(|t| (t.qpn, t.state)).collect::<Vec<_>>(),
                        c.qp_created,
                        c.qp_destroyed,
                        c.tx_established,
                        c.tx_failed,
                        c.rx_accepted,
                        c.rx_packets,
                        c.tx_packets,
                    );
                }
                None => eprintln!("  node {i}: dead"),
            }
        }
    }

    // ---------------------------------------------------------------------------------------
    // Steps

    fn tun(&mut self, i: usize, u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let s = TunSpec::arbitrary(u)?;
        tr!("  tun {i}: {s:?}");
        let n = self.nodes.len();
        let p = match s {
            TunSpec::Ping4 { to, len } => {
                let dst = match to {
                    DstSel::Node(j) => v4(usize::from(j) % n),
                    DstSel::Unknown => Ipv4Addr::new(198, 19, 0, 9),
                    DstSel::Multicast => Ipv4Addr::new(198, 19, 0, 255),
                };
                ping4(v4(i), dst, usize::from(len).min(65_507))
            }
            TunSpec::Ping6 { to, len } => {
                let dst = match to {
                    DstSel::Node(j) => v6(usize::from(j) % n),
                    DstSel::Unknown => Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, 0, 0, 0, 9),
                    DstSel::Multicast => Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
                };
                ping6(v6(i), dst, usize::from(len).min(65_527))
            }
            TunSpec::Raw => u.bytes(u.len())?.to_vec(),
        };
        let now = self.now();
        if let Some(ep) = self.nodes[i].ep.as_mut() {
            ep.handle_tun_packet(now, &mut self.f.nodes[i], &p);
        }
        Ok(())
    }

    fn kill(&mut self, i: usize) {
        self.f.partitioned[i] = true;
        self.nodes[i].ep = None;
        self.nodes[i].mad = None;
        self.nodes[i].stopping = false;
    }

    fn shutdown(&mut self, i: usize, force: bool) {
        let now = self.now();
        let n = &mut self.nodes[i];
        let Some(ep) = n.ep.as_mut() else { return };
        if force {
            if n.stopping {
                ep.force_stop(&mut self.f.nodes[i]);
                assert!(ep.is_stopped(), "node {i}: not stopped after force_stop");
            }
        } else {
            if !n.stopping {
                n.created_at_stop = ep.counters().qp_created;
            }
            ep.begin_shutdown(now, &mut self.f.nodes[i]);
            if let Some(gsi) = n.mad.as_mut() {
                mad::send_while_room(gsi, &mut self.f.nodes[i], || ep.poll_mad());
            }
            n.stopping = true;
        }
    }

    /// Delivers `d` to node `i` as if node `from` (an underlay address) had sent it.
    fn datagram(&mut self, i: usize, from: IpAddr, d: &[u8]) {
        if self.nodes[i].ep.is_none() {
            return;
        }
        let now = self.now();
        let src = SocketAddr::new(from, ROCEV2_UDP_PORT);
        self.f.nodes[i].handle_datagram(now, src, underlay(i), d);
    }

    fn ip(&self, from: IpAddr, i: usize) -> IpHeaderInfo {
        match (from, underlay(i)) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => IpHeaderInfo::V4 {
                src,
                dst,
                identification: 0,
                dont_fragment: true,
            },
            _ => unreachable!("IPv4 underlay"),
        }
    }

    fn raw_datagram(&mut self, body: &[u8]) {
        let Some((&sel, d)) = body.split_first() else {
            return;
        };
        let i = self.node(sel & 3);
        let from = match (sel >> 2) & 3 {
            3 => IpAddr::from([198, 18, 0, 77]),
            j => underlay(usize::from(j) % self.nodes.len()),
        };
        let mut d = d.to_vec();
        if sel & 0x80 != 0 && d.len() >= Bth::HEADER_LEN + ICRC_LEN {
            // A valid ICRC, so the bytes reach the parser and the QPs.
            let n = d.len() - ICRC_LEN;
            let icrc = compute_icrc(&self.ip(from, i), ROCEV2_UDP_PORT, ROCEV2_UDP_PORT, &d[..n]);
            d[n..].copy_from_slice(&icrc.to_le_bytes());
        }
        tr!("  raw datagram to {i} from {from}: {} bytes", d.len());
        self.datagram(i, from, &d);
    }

    fn roce(&mut self, u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let s = RoceSpec::arbitrary(u)?;
        let i = self.node(s.node);
        let Some(ep) = self.nodes[i].ep.as_ref() else {
            return Ok(());
        };
        let snap = ep.snapshot(self.now());
        let ud_qpn = ep.hwaddr().qpn;
        let mut from = underlay(self.node(s.from));
        let (dest_qp, qkey) = match s.qp {
            QpSel::Ud => (ep.hwaddr().qpn.get(), UD_QKEY),
            QpSel::Gsi => (1, GSI_QKEY),
            QpSel::Multicast => (0xFF_FFFF, UD_QKEY),
            QpSel::Rx(k) if !snap.rx.is_empty() => {
                let r = &snap.rx[usize::from(k) % snap.rx.len()];
                from = r.0.to_ip();
                (r.1.get(), 0)
            }
            QpSel::Tx(k) if !snap.tx.is_empty() => {
                let t = &snap.tx[usize::from(k) % snap.tx.len()];
                from = t.peer.gid.to_ip();
                (t.qpn.get(), 0)
            }
            QpSel::Rx(k) | QpSel::Tx(k) => (0x11 + u32::from(k), 0),
            QpSel::Other(q) => (q & 0xFF_FFFF, UD_QKEY),
        };
        if !matches!(from, IpAddr::V4(_)) {
            return Ok(());
        }
        let ops = opcodes();
        let op = ops[usize::from(s.opcode) % ops.len()];
        let mut bth = Bth::new(op, dest_qp, s.psn & 0xFF_FFFF);
        bth.ack_req = s.ack_req;
        let repr = RoceRepr {
            bth,
            reth: op.has_reth().then_some(Reth {
                va: 0,
                rkey: 0,
                dma_len: 64,
            }),
            aeth: op.has_aeth().then_some(Aeth {
                syndrome: Syndrome::from_byte(s.syndrome & 0x7F)
                    .unwrap_or(Syndrome::Ack { credits: 0x1F }),
                msn: s.msn & 0xFF_FFFF,
            }),
            deth: op.has_deth().then_some(Deth {
                qkey: if s.right_qkey { qkey } else { s.qkey },
                src_qp: if dest_qp == 1 {
                    1
                } else {
                    s.src_qp & 0xFF_FFFF
                },
            }),
            imm: op.has_immediate().then_some(ImmDt(0x1234)),
        };
        let rest = u.bytes(u.len())?;
        let payload = match s.payload {
            PayloadSel::Ipoib(t) => {
                let ethertype: u16 = match t % 4 {
                    0 => 0x0800,
                    1 => 0x86DD,
                    2 => 0x0806,
                    _ => u16::from_be_bytes([t, t]),
                };
                let mut p = vec![0u8; 4];
                p[..2].copy_from_slice(&ethertype.to_be_bytes());
                p.extend_from_slice(rest);
                p
            }
            PayloadSel::Mad(k) => mad(k, rest, from, underlay(i), ud_qpn),
            PayloadSel::Raw => rest.to_vec(),
        };
        let payload = if op.has_payload() {
            &payload[..payload.len().min(4096)]
        } else {
            &[][..]
        };
        if repr.check().is_err() {
            return Ok(());
        }
        let mut d = Vec::new();
        repr.emit(
            payload,
            &self.ip(from, i),
            ROCEV2_UDP_PORT,
            ROCEV2_UDP_PORT,
            &mut d,
        );
        tr!(
            "  roce to {i} from {from}: {op} qp {dest_qp} psn {} {} bytes",
            bth.psn,
            payload.len()
        );
        self.datagram(i, from, &d);
        Ok(())
    }

    fn op(&mut self, tag: u8, body: &[u8]) {
        let mut u = Unstructured::new(body);
        tr!(
            "op {} ({} bytes) at {:?}",
            tag % 9,
            body.len(),
            self.now() - self.start
        );
        let first = body.first().copied().unwrap_or(0);
        let i = self.node(first);
        match tag % 9 {
            0 | 1 => {
                let _ = u.bytes(1);
                let _ = self.tun(i, &mut u);
            }
            2 => {
                tr!("  kill {i}");
                self.kill(i);
            }
            3 => {
                tr!("  restart {i}");
                self.boot(i);
            }
            4 => {
                tr!("  shutdown {i} (force: {})", first & 0x80 != 0);
                self.shutdown(i, first & 0x80 != 0);
            }
            5 | 6 => {
                let ms = u16::arbitrary(&mut u).unwrap_or(100);
                tr!("  run {ms} ms");
                self.run(Duration::from_millis(u64::from(ms)));
            }
            7 => self.raw_datagram(body),
            _ => {
                let _ = self.roce(&mut u);
            }
        }
        self.service();
        self.f.transmit();
        self.check();
        self.check_connections();
        if trace() {
            self.summary();
        }
    }

    /// At most `max_conn_qp` live RX connections, and at most one TX connection per peer that
    /// is not closing.
    fn check_connections(&self) {
        for (i, n) in self.nodes.iter().enumerate() {
            let Some(ep) = n.ep.as_ref() else { continue };
            let s = ep.snapshot(self.now());
            let live = s.rx.iter().filter(|r| r.2 == RxState::Live).count();
            assert!(
                live <= ep.config().max_conn_qp,
                "node {i}: {live} live RX connections, max_conn_qp {}",
                ep.config().max_conn_qp
            );
            let mut peers: Vec<_> =
                s.tx.iter()
                    .filter(|t| t.state != TxState::Closing)
                    .map(|t| (t.peer.gid, t.peer.qpn))
                    .collect();
            let all = peers.len();
            peers.sort_by_key(|(g, q)| (g.0, q.get()));
            peers.dedup();
            assert_eq!(
                peers.len(),
                all,
                "node {i}: two open TX connections to one peer: {:?}",
                s.tx
            );
        }
    }

    fn finish(&mut self) {
        tr!("quiet phase");
        self.run(QUIET);
        if trace() {
            self.summary();
            for (i, n) in self.nodes.iter().enumerate() {
                if let Some(ep) = n.ep.as_ref() {
                    eprintln!("  node {i} counters {:?}", ep.counters());
                    eprintln!("  node {i} provider {:?}", self.f.nodes[i].stats());
                }
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let Some(ep) = n.ep.as_ref() else { continue };
            let s = ep.snapshot(self.now());
            let what = || {
                format!(
                    "node {i}: after {QUIET:?} quiet: qp_count {}, rx {:?}, tx {:?}, counters {:?}",
                    self.f.nodes[i].qp_count(),
                    s.rx,
                    s.tx,
                    s.counters
                )
            };
            assert_eq!(ep.rx_count(), 0, "{}", what());
            assert_eq!(ep.tx_count(), 0, "{}", what());
            assert_eq!(self.f.nodes[i].qp_count(), BASELINE_QPS, "{}", what());
            if !n.stopping {
                assert_eq!(
                    self.f.nodes[i].pools().posted_count(),
                    n.posted_at_boot,
                    "receive buffers posted now vs after Endpoint::new; {}",
                    what()
                );
            }
            if n.stopping {
                assert!(ep.is_stopped(), "{}", what());
            }
        }
    }
}

/// A CM MAD for QP1 of the node at `to` (UD QPN `ud_qpn`) from `from`: `k` picks a message
/// built around comm ids read from `rest`, a REQ, or `rest` itself (padded to 256 bytes).
/// The REQ goes to the rdma_cm service (or the standard one) with a `cma_hdr` (valid, naming
/// another node, or none: the bytes of `rest`) in front of `ipoib_cm_data`.
fn mad(k: u8, rest: &[u8], from: IpAddr, to: IpAddr, ud_qpn: QpNum) -> Vec<u8> {
    let word = |o: usize| {
        let mut b = [0u8; 4];
        for (d, s) in b.iter_mut().zip(rest.iter().skip(o)) {
            *d = *s;
        }
        u32::from_be_bytes(b)
    };
    let (ours, theirs) = (word(0), word(4));
    let msg = match k % 5 {
        0 => CmMessage::Rej(Rej {
            local_comm_id: theirs,
            remote_comm_id: ours,
            msg_rejected: TargetMsg::from_bits(k >> 2),
            reason: RejReason::from_code(u16::from(k >> 4)),
            ..Rej::default()
        }),
        1 => CmMessage::Dreq(Dreq {
            local_comm_id: theirs,
            remote_comm_id: ours,
            remote_qpn: QpNum::new(word(8)),
            ..Dreq::default()
        }),
        2 => CmMessage::Rtu(Rtu {
            local_comm_id: theirs,
            remote_comm_id: ours,
            ..Rtu::default()
        }),
        4 => CmMessage::Req(req(k / 5, rest, from, to, ud_qpn, theirs, word(8))),
        _ => {
            let mut m = rest.to_vec();
            m.resize(MAD_LEN, 0);
            return m;
        }
    };
    CmMad::new(u64::from(word(12)), msg).emit().to_vec()
}

/// A REQ from `from` to `to` with comm id and QPN `comm_id` and `qpn`; `bits` pick the
/// service (1: the standard one, else rdma_cm's at its default port) and the private data (2:
/// a valid `cma_hdr`, 4: one naming another address, neither: `rest` as it is; then
/// `ipoib_cm_data`).
fn req(
    bits: u8,
    rest: &[u8],
    from: IpAddr,
    to: IpAddr,
    ud_qpn: QpNum,
    comm_id: u32,
    qpn: u32,
) -> Req {
    let service_id = if bits & 1 != 0 {
        ipoib_service_id(ud_qpn, true)
    } else {
        PortSpace::Ib.service_id(DEFAULT_RDMA_CM_PORT)
    };
    let ipoib = IpoibCmData {
        qpn: QpNum::new(qpn & 0xFF_FFFF),
        mtu: IpoibCmData::LINUX_MTU,
    }
    .to_bytes();
    let dst = if bits & 4 != 0 {
        IpAddr::from([198, 18, 0, 99])
    } else {
        to
    };
    let data = if bits & 6 != 0 {
        let hdr = CmaHdr {
            src_port: 40000,
            src: from,
            dst,
        };
        hdr.req_private_data(&ipoib).unwrap_or_default()
    } else {
        rest.to_vec()
    };
    let mut private_data = [0u8; Req::PRIVATE_DATA_LEN];
    for (d, s) in private_data.iter_mut().zip(data) {
        *d = s;
    }
    Req {
        local_comm_id: comm_id,
        service_id,
        local_ca_guid: 0xF022_0000_0000_0000 | u64::from(comm_id),
        local_qpn: QpNum::new(qpn & 0xFF_FFFF),
        transport_service_type: Req::TRANSPORT_RC,
        local_cm_response_timeout: 16,
        remote_cm_response_timeout: 16,
        retry_count: 7,
        rnr_retry_count: 7,
        path_mtu: Some(PathMtu::Mtu1024),
        max_cm_retries: 3,
        primary_path: CmPath {
            local_gid: Gid::from_ip(from),
            remote_gid: Gid::from_ip(to),
            local_ack_timeout: 14,
            ..CmPath::default()
        },
        private_data,
        ..Req::default()
    }
}

fn chunks(data: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.len() < 3 {
            return None;
        }
        let tag = rest[0];
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        let body = &rest[3..3 + len];
        rest = &rest[3 + len..];
        Some((tag, body))
    })
}

fuzz_target!(|data: &[u8]| {
    let mut it = chunks(data);
    let setup = it
        .next()
        .map(|(_, b)| Setup::arbitrary(&mut Unstructured::new(b)).unwrap_or_default())
        .unwrap_or_default();
    tr!("{setup:?}");
    let mut net = Net::new(&setup, Instant::now());
    for (tag, body) in it.take(MAX_OPS) {
        net.op(tag, body);
    }
    net.finish();
});
