//! Two or three `Cm` instances (distinct GIDs) exchanging MADs over an in-memory network that
//! the fuzzer drives, with a virtual clock.
//!
//! The input is a sequence of chunks `[tag: u8][len: u16 LE][body: len bytes]`. The first
//! chunk's body is the set-up (`Setup`, decoded with `arbitrary`; a short one means defaults):
//! how many instances and their `CmConfig` tweaks. Every later chunk is one operation, picked
//! by `tag % 13`, its body decoded with `arbitrary`:
//!
//! - the owner's calls, on ids that exist or not: `connect` (to an instance, to itself or to
//!   a GID nobody has), `accept`, `reject`, `rtu`, `notify_comm_est`, `disconnect`, `listen`;
//! - the network: deliver the k-th MAD in flight (so: reorder), drop it, duplicate it,
//!   deliver everything in order;
//! - injected MADs: raw bytes, a MAD in flight with bytes overwritten, or a message crafted
//!   around ids that exist (REQ, MRA, REJ, REP, RTU, DREQ, DREP), from any GID including
//!   forged ones;
//! - time: advance by 0..100 s (with or without running the timers), or to the next timer.
//!
//! Invariants, after every operation and for every instance:
//! - no panic; every MAD the CM transmits parses;
//! - after `handle_timeout(now)`: `poll_timeout()` is `None` or later than `now`, and a second
//!   `handle_timeout(now)` sends nothing, raises nothing and changes no counter;
//! - `len()` equals the number of ids the owner learnt (from `connect` and `ReqReceived`)
//!   that `state()` still knows: the CM holds no id its owner cannot see; and `len()` is at
//!   most the successful connects plus the REQs delivered;
//! - states the CM never keeps (Idle, MraReqSent, MraRepSent, DreqRcvd) are never reported;
//! - every event agrees with the state of its id right after the operation, and every owner
//!   call does what its documentation says (result and resulting state);
//! - `stats().mads_received` counts every `handle_mad`, and no MAD is answered with more
//!   than one (no amplification).
//!
//! Final phase, with no new input (`settle`: deliver everything in flight, in order, then
//! jump to the next timer, until no timer is left):
//! 1. Without the owner: afterwards no instance has a timer, and every id left is in a state
//!    that waits for its owner by design: ReqRcvd (accept/reject), RepRcvd (rtu) or
//!    Established (disconnect). "Every `len()` returns to 0" is too strong without the owner:
//!    those three states have no timer (as in Linux; the CM has no keepalive). The virtual
//!    time this takes is bounded, but not by 20 minutes: a forged REQ may ask for a CM
//!    response timeout of 2^31 × 4 µs (≈ 2.3 h per REP retry, up to 15 retries), and a forged
//!    MRA stretches a REQ's retry interval the same way, so the bound is 16 retries × 3 ×
//!    2^23 ms ≈ 112 h plus TimeWait; the settle asserts it stays under `SETTLE_BOUND`.
//! 2. The owner disconnects every id it knows that is still live; after another settle every
//!    instance's `len()` is 0 (all ids freed through REJ, DREQ/DREP or its retries, and
//!    TimeWait).
//!
//! `CM_FUZZ_TRACE=1` prints every operation, delivery, event and the final states.
#![no_main]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::Ipv4Addr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use ipoib_cm::cm::{
    AcceptParams, Cm, CmConfig, CmEvent, CmState, CmUseError, CommId, ConnectParams, MAX_LIVE_IDS,
};
use ipoib_cm::verbs::{Gid, PathMtu, Psn, QpNum};
use ipoib_cm::wire::cm::{
    ipoib_service_id, CmMad, CmMessage, CmPath, Drep, Dreq, Mra, Rej, RejReason, Rep, Req, Rtu,
    TargetMsg,
};
use libfuzzer_sys::fuzz_target;

const MAX_OPS: usize = 256;
/// Most MADs in flight; beyond it the network drops what is sent.
const NET_CAP: usize = 256;
/// The service every instance listens on from the start (IPoIB-CM, UD QPN 0x12).
const SERVICE: u64 = ipoib_service_id(QpNum::new(0x12), true);
/// Upper bound of one settle's virtual time (see the module docs).
const SETTLE_BOUND: Duration = Duration::from_secs(113 * 3600);
/// Most steps (deliveries plus timer jumps) of one settle.
const SETTLE_STEPS: usize = 200_000;

fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("CM_FUZZ_TRACE").is_some())
}

macro_rules! tr {
    ($($a:tt)*) => { if trace() { eprintln!($($a)*); } };
}

fn node_gid(i: usize) -> Gid {
    Gid::from(Ipv4Addr::new(198, 18, 0, i as u8 + 1))
}

/// A GID no instance has.
fn forged_gid(x: u32) -> Gid {
    let [a, b, c, _] = x.to_be_bytes();
    Gid::from(Ipv4Addr::new(198, 18 | (a & 1), b, c.max(4)))
}

fn guid(i: usize) -> u64 {
    0x0002_C903_0000_0000 | (i as u64 + 1) << 8 | 1
}

#[derive(Arbitrary, Debug, Default)]
struct NodeSetup {
    /// Use the fields below instead of `CmConfig::new`'s defaults.
    custom: bool,
    cm_response_timeout: u8,
    max_cm_retries: u8,
    packet_life_time: u8,
    timewait_ms: u16,
    comm_id_seed: u32,
    /// Do not listen on `SERVICE` from the start.
    no_listen: bool,
}

#[derive(Arbitrary, Debug, Default)]
struct Setup {
    three: bool,
    nodes: [NodeSetup; 3],
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum IdSel {
    /// The k-th id this instance's owner learnt (modulo their number).
    Known(u8),
    Raw(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum PeerSel {
    Node(u8),
    Forged(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum ServiceSel {
    Ipoib,
    Rfc4755,
    OtherQpn(u32),
    Raw(u64),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum MaskSel {
    Exact,
    AnyQpn,
    All,
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
struct ConnectSpec {
    node: u8,
    peer: PeerSel,
    service: ServiceSel,
    qpn: u32,
    psn: u32,
    mtu: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: bool,
    local_ack_timeout: u8,
    private_len: u8,
}

#[derive(Arbitrary, Debug)]
struct AcceptSpec {
    node: u8,
    id: IdSel,
    qpn: u32,
    psn: u32,
    srq: bool,
    rnr_retry_count: u8,
    private_len: u8,
}

#[derive(Arbitrary, Debug)]
enum NetOp {
    Deliver(u16),
    Drop(u16),
    Duplicate(u16),
    DeliverAll,
}

#[derive(Arbitrary, Debug)]
struct Mutation {
    idx: u16,
    /// Deliver to this instance instead of the MAD's destination.
    to: Option<u8>,
    /// Claim this sender instead of the real one.
    from: Option<PeerSel>,
}

#[derive(Arbitrary, Debug)]
enum Craft {
    Req {
        service: ServiceSel,
        qpn: u32,
        psn: u32,
        mtu: u8,
        transport: u8,
        right_gid: bool,
        local_cm_response_timeout: u8,
        max_cm_retries: u8,
        sender_guid: bool,
        private_qpn: u32,
    },
    Mra {
        msg: u8,
        service_timeout: u8,
    },
    Rej {
        msg: u8,
        reason: u16,
        guid_in_ari: bool,
    },
    Rep {
        qpn: u32,
        psn: u32,
        mtu: u32,
        sender_guid: bool,
    },
    Rtu,
    Dreq {
        right_qpn: bool,
        qpn: u32,
    },
    Drep,
}

#[derive(Arbitrary, Debug)]
struct CraftSpec {
    to: u8,
    from: PeerSel,
    /// The receiver's id (Remote Comm ID of the message).
    ours: IdSel,
    /// The sender's id (Local Comm ID), among the sending instance's ids if it is one.
    theirs: IdSel,
    tid: u64,
    craft: Craft,
}

#[derive(Debug, Clone)]
struct Flight {
    from: Gid,
    to: Gid,
    mad: Vec<u8>,
}

struct Node {
    cm: Cm,
    gid: Gid,
    guid: u64,
    /// Every id the owner learnt, in the order it learnt them.
    ids: Vec<CommId>,
    known: BTreeSet<CommId>,
    /// Our QPN per id (what `connect` / `accept` announced).
    qpns: BTreeMap<CommId, QpNum>,
    connects: u64,
    reqs_in: u64,
    mads_in: u64,
    /// The CM's `stale_rejected` when the owner last collected its events.
    stale_seen: u64,
}

struct Harness {
    nodes: Vec<Node>,
    start: Instant,
    now: Instant,
    net: VecDeque<Flight>,
    undeliverable: u64,
}

fn mtu(v: u8) -> PathMtu {
    PathMtu::from_enum(v % 5 + 1).expect("1..=5")
}

fn service(s: ServiceSel) -> u64 {
    match s {
        ServiceSel::Ipoib => SERVICE,
        ServiceSel::Rfc4755 => ipoib_service_id(QpNum::new(0x12), false),
        ServiceSel::OtherQpn(q) => ipoib_service_id(QpNum::new(q), true),
        ServiceSel::Raw(r) => r,
    }
}

fn pad(n: u8, fill: u8) -> Vec<u8> {
    vec![fill; usize::from(n)]
}

impl Harness {
    fn new(s: &Setup, start: Instant) -> Self {
        let n = if s.three { 3 } else { 2 };
        let nodes = (0..n)
            .map(|i| {
                let ns = &s.nodes[i];
                let mut c = CmConfig::new(node_gid(i), guid(i));
                if ns.custom {
                    c.cm_response_timeout = ns.cm_response_timeout % 32;
                    c.max_cm_retries = ns.max_cm_retries % 16;
                    c.packet_life_time = ns.packet_life_time % 32;
                    c.timewait = Duration::from_millis(u64::from(ns.timewait_ms % 5001));
                    c.comm_id_seed = ns.comm_id_seed;
                }
                let mut cm = Cm::new(c);
                if !ns.no_listen {
                    cm.listen(SERVICE, u64::MAX);
                }
                Node {
                    cm,
                    gid: node_gid(i),
                    guid: guid(i),
                    ids: Vec::new(),
                    known: BTreeSet::new(),
                    qpns: BTreeMap::new(),
                    connects: 0,
                    reqs_in: 0,
                    mads_in: 0,
                    stale_seen: 0,
                }
            })
            .collect();
        Self {
            nodes,
            start,
            now: start,
            net: VecDeque::new(),
            undeliverable: 0,
        }
    }

    fn node(&self, n: u8) -> usize {
        usize::from(n) % self.nodes.len()
    }

    fn peer(&self, p: PeerSel) -> Gid {
        match p {
            PeerSel::Node(n) => self.nodes[self.node(n)].gid,
            PeerSel::Forged(x) => forged_gid(x),
        }
    }

    fn id(&self, i: usize, s: IdSel) -> CommId {
        match s {
            IdSel::Known(k) => {
                let ids = &self.nodes[i].ids;
                if ids.is_empty() {
                    CommId(u32::from(k))
                } else {
                    ids[usize::from(k) % ids.len()]
                }
            }
            IdSel::Raw(r) => CommId(r),
        }
    }

    fn learn(&mut self, i: usize, id: CommId) {
        let n = &mut self.nodes[i];
        if n.known.insert(id) {
            n.ids.push(id);
        }
    }

    fn send(&mut self, f: Flight) {
        if self.net.len() < NET_CAP {
            self.net.push_back(f);
        }
    }

    fn deliver(&mut self, f: Flight) {
        let Some(i) = self.nodes.iter().position(|n| n.gid == f.to) else {
            self.undeliverable += 1;
            return;
        };
        let parsed = CmMad::parse(&f.mad);
        tr!(
            "  deliver {} -> {} ({}): {:?}",
            f.from,
            i,
            f.mad.len(),
            parsed.as_ref().map(|m| m.msg.attr_id())
        );
        let n = &mut self.nodes[i];
        let is_req = matches!(
            parsed,
            Ok(CmMad {
                msg: CmMessage::Req(_),
                ..
            })
        );
        if is_req {
            n.reqs_in += 1;
        }
        n.mads_in += 1;
        let sent = n.cm.stats().mads_sent;
        n.cm.handle_mad(self.now, f.from, &f.mad);
        // A REQ naming a (CA GUID, QPN) a live connection still uses draws the REJ
        // STALE_CONN and a DREQ to that connection (Linux's cm_match_req): two.
        let most = if is_req { 2 } else { 1 };
        assert!(
            n.cm.stats().mads_sent <= sent + most,
            "node {i}: one MAD in, {} out",
            n.cm.stats().mads_sent - sent
        );
    }

    /// Runs the timers of every instance and checks `handle_timeout`'s contract.
    fn fire(&mut self) {
        for i in 0..self.nodes.len() {
            self.nodes[i].cm.handle_timeout(self.now);
            self.collect(i);
            let n = &mut self.nodes[i];
            if let Some(t) = n.cm.poll_timeout() {
                assert!(t > self.now, "node {i}: handle_timeout left a timer due");
            }
            let stats = n.cm.stats();
            n.cm.handle_timeout(self.now);
            assert_eq!(
                n.cm.stats(),
                stats,
                "node {i}: handle_timeout not idempotent"
            );
            assert!(
                n.cm.poll_transmit().is_none(),
                "node {i}: second handle_timeout sent"
            );
            assert!(
                n.cm.poll_event().is_none(),
                "node {i}: second handle_timeout raised"
            );
        }
    }

    /// Moves what instance `i` transmits onto the network and checks its events.
    fn collect(&mut self, i: usize) {
        let gid = self.nodes[i].gid;
        while let Some((to, mad)) = self.nodes[i].cm.poll_transmit() {
            let m = CmMad::parse(&mad)
                .unwrap_or_else(|e| panic!("node {i} transmitted an invalid MAD ({e:?})"));
            tr!("  node {i} sends {:?} to {to}", m.msg.attr_id());
            self.send(Flight {
                from: gid,
                to,
                mad: mad.to_vec(),
            });
        }
        let mut last: BTreeMap<CommId, CmEvent> = BTreeMap::new();
        while let Some(e) = self.nodes[i].cm.poll_event() {
            tr!("  node {i} event {e:?}");
            let id = match &e {
                CmEvent::ReqReceived { id, peer, .. } => {
                    assert!(
                        !self.nodes[i].known.contains(id),
                        "node {i}: ReqReceived reuses {id:?}"
                    );
                    let _ = peer;
                    self.learn(i, *id);
                    *id
                }
                CmEvent::RepReceived { id, .. }
                | CmEvent::Established { id }
                | CmEvent::Rejected { id, .. }
                | CmEvent::DisconnectReceived { id }
                | CmEvent::Disconnected { id }
                | CmEvent::TimeWaitExit { id } => *id,
                CmEvent::TimedOut { id, state } => {
                    assert!(
                        matches!(
                            state,
                            CmState::ReqSent
                                | CmState::MraReqRcvd
                                | CmState::RepSent
                                | CmState::MraRepRcvd
                        ),
                        "node {i}: TimedOut in {state:?}"
                    );
                    *id
                }
            };
            assert!(
                self.nodes[i].known.contains(&id),
                "node {i}: event for an id the owner never learnt: {e:?}"
            );
            last.insert(id, e);
        }
        let stale = self.nodes[i].cm.stats().stale_rejected;
        // A REQ from a QP an established connection still uses: the CM sends that
        // connection's DREQ itself (as Linux's `cm_match_req`), its end reported later.
        let stale_dreq = stale > self.nodes[i].stale_seen;
        self.nodes[i].stale_seen = stale;
        let cm = &self.nodes[i].cm;
        for (id, e) in last {
            let s = cm.state(id);
            let ok = match e {
                CmEvent::ReqReceived { .. } => s == Some(CmState::ReqRcvd),
                CmEvent::RepReceived { .. } => s == Some(CmState::RepRcvd),
                CmEvent::Established { .. } => {
                    s == Some(CmState::Established)
                        || (stale_dreq && s == Some(CmState::DreqSent))
                }
                CmEvent::Rejected { .. } => matches!(s, None | Some(CmState::TimeWait)),
                CmEvent::TimedOut { state, .. } => match state {
                    CmState::ReqSent | CmState::MraReqRcvd => s.is_none(),
                    _ => s == Some(CmState::TimeWait),
                },
                CmEvent::DisconnectReceived { .. } | CmEvent::Disconnected { .. } => {
                    s == Some(CmState::TimeWait)
                }
                CmEvent::TimeWaitExit { .. } => s.is_none(),
            };
            assert!(ok, "node {i}: {id:?} is {s:?} after {e:?}");
        }
    }

    fn check(&mut self) {
        for i in 0..self.nodes.len() {
            self.collect(i);
            let n = &self.nodes[i];
            let live = n
                .known
                .iter()
                .filter(|id| n.cm.state(**id).is_some())
                .count();
            assert_eq!(
                n.cm.len(),
                live,
                "node {i}: the CM holds ids its owner never learnt"
            );
            assert_eq!(n.cm.is_empty(), live == 0);
            assert!(n.cm.len() <= MAX_LIVE_IDS);
            assert!(
                n.cm.len() as u64 <= n.connects + n.reqs_in,
                "node {i}: {} ids from {} connects and {} REQs",
                n.cm.len(),
                n.connects,
                n.reqs_in
            );
            for id in &n.known {
                if let Some(s) = n.cm.state(*id) {
                    assert!(
                        !matches!(
                            s,
                            CmState::Idle
                                | CmState::MraReqSent
                                | CmState::MraRepSent
                                | CmState::DreqRcvd
                        ),
                        "node {i}: {id:?} in {s:?}"
                    );
                }
            }
            assert_eq!(n.cm.stats().mads_received, n.mads_in);
        }
    }

    // ---------------------------------------------------------------------------------------
    // Owner calls

    fn connect(&mut self, s: &ConnectSpec) {
        let i = self.node(s.node);
        let private_len = s.private_len % 100;
        let p = ConnectParams {
            peer: self.peer(s.peer),
            service_id: service(s.service),
            local_qpn: QpNum::new(s.qpn),
            starting_psn: Psn::new(s.psn),
            path_mtu: mtu(s.mtu),
            retry_count: s.retry_count % 8,
            rnr_retry_count: s.rnr_retry_count % 8,
            srq: s.srq,
            local_ack_timeout: s.local_ack_timeout % 32,
            private_data: pad(private_len, 0xC1),
            path: None,
        };
        let r = self.nodes[i].cm.connect(self.now, p);
        tr!("  -> {r:?}");
        match r {
            Ok(id) => {
                assert!(private_len <= 92);
                assert!(!self.nodes[i].known.contains(&id), "connect reused {id:?}");
                self.nodes[i].connects += 1;
                self.learn(i, id);
                self.nodes[i].qpns.insert(id, QpNum::new(s.qpn));
                assert_eq!(self.nodes[i].cm.state(id), Some(CmState::ReqSent));
            }
            Err(CmUseError::PrivateDataTooLong) => assert!(private_len > 92),
            Err(CmUseError::NoResources) => assert!(self.nodes[i].cm.len() >= MAX_LIVE_IDS),
            Err(e) => panic!("connect: {e:?}"),
        }
    }

    fn accept(&mut self, s: &AcceptSpec) {
        let i = self.node(s.node);
        let id = self.id(i, s.id);
        let before = self.nodes[i].cm.state(id);
        let private_len = s.private_len % 200;
        let p = AcceptParams {
            local_qpn: QpNum::new(s.qpn),
            starting_psn: Psn::new(s.psn),
            srq: s.srq,
            rnr_retry_count: s.rnr_retry_count % 8,
            private_data: pad(private_len, 0xA5),
        };
        let r = self.nodes[i].cm.accept(self.now, id, p);
        let after = self.nodes[i].cm.state(id);
        tr!("  {id:?} {before:?} -> {r:?} {after:?}");
        match (before, r) {
            (None, Err(CmUseError::NoSuchId)) => {}
            (Some(CmState::ReqRcvd), Ok(())) => {
                assert!(private_len <= 196);
                assert_eq!(after, Some(CmState::RepSent));
                self.nodes[i].qpns.insert(id, QpNum::new(s.qpn));
            }
            (Some(CmState::ReqRcvd), Err(CmUseError::PrivateDataTooLong)) => {
                assert!(private_len > 196);
                assert_eq!(after, before);
            }
            (Some(s), Err(CmUseError::WrongState(w))) if s != CmState::ReqRcvd => {
                assert_eq!(w, s);
                assert_eq!(after, before);
            }
            (b, r) => panic!("accept of {id:?} in {b:?}: {r:?}"),
        }
    }

    fn reject(&mut self, i: usize, id: CommId, reason: u16) {
        let before = self.nodes[i].cm.state(id);
        let r = self.nodes[i]
            .cm
            .reject(self.now, id, RejReason::from_code(reason));
        let after = self.nodes[i].cm.state(id);
        tr!("  {id:?} {before:?} -> {r:?} {after:?}");
        match (before, r) {
            (None, Err(CmUseError::NoSuchId)) => {}
            (Some(CmState::RepSent | CmState::MraRepRcvd), Ok(())) => {
                assert_eq!(after, Some(CmState::TimeWait))
            }
            (
                Some(CmState::ReqSent | CmState::MraReqRcvd | CmState::ReqRcvd | CmState::RepRcvd),
                Ok(()),
            ) => assert_eq!(after, None),
            (Some(s @ (CmState::Established | CmState::DreqSent | CmState::TimeWait)), r) => {
                assert_eq!(r, Err(CmUseError::WrongState(s)));
                assert_eq!(after, before);
            }
            (b, r) => panic!("reject of {id:?} in {b:?}: {r:?}"),
        }
    }

    fn rtu(&mut self, i: usize, id: CommId) {
        let before = self.nodes[i].cm.state(id);
        let r = self.nodes[i].cm.rtu(self.now, id);
        let after = self.nodes[i].cm.state(id);
        tr!("  {id:?} {before:?} -> {r:?} {after:?}");
        match (before, r) {
            (None, Err(CmUseError::NoSuchId)) => {}
            (Some(CmState::RepRcvd), Ok(())) => assert_eq!(after, Some(CmState::Established)),
            (Some(s), Err(CmUseError::WrongState(w))) if s != CmState::RepRcvd => {
                assert_eq!(w, s);
                assert_eq!(after, before);
            }
            (b, r) => panic!("rtu of {id:?} in {b:?}: {r:?}"),
        }
    }

    fn notify_comm_est(&mut self, i: usize, id: CommId) {
        let before = self.nodes[i].cm.state(id);
        self.nodes[i].cm.notify_comm_est(self.now, id);
        let after = self.nodes[i].cm.state(id);
        tr!("  {id:?} {before:?} -> {after:?}");
        match before {
            Some(CmState::RepSent | CmState::MraRepRcvd) => {
                assert_eq!(after, Some(CmState::Established))
            }
            b => assert_eq!(after, b),
        }
    }

    fn disconnect(&mut self, i: usize, id: CommId) {
        let before = self.nodes[i].cm.state(id);
        let r = self.nodes[i].cm.disconnect(self.now, id);
        let after = self.nodes[i].cm.state(id);
        tr!("  {id:?} {before:?} -> {r:?} {after:?}");
        match (before, r) {
            (None, Err(CmUseError::NoSuchId)) => {}
            (Some(b), Ok(())) => {
                let want = match b {
                    CmState::Established => Some(CmState::DreqSent),
                    CmState::ReqSent
                    | CmState::MraReqRcvd
                    | CmState::ReqRcvd
                    | CmState::RepRcvd => None,
                    CmState::RepSent | CmState::MraRepRcvd => Some(CmState::TimeWait),
                    s => Some(s),
                };
                assert_eq!(after, want, "disconnect of {id:?} in {b:?}");
            }
            (b, r) => panic!("disconnect of {id:?} in {b:?}: {r:?}"),
        }
    }

    // ---------------------------------------------------------------------------------------
    // The network

    fn net(&mut self, op: &NetOp) {
        if self.net.is_empty() {
            return;
        }
        let k = |i: &u16| usize::from(*i) % self.net.len();
        match op {
            NetOp::Deliver(i) => {
                let f = self.net.remove(k(i)).expect("in range");
                self.deliver(f);
            }
            NetOp::Drop(i) => {
                self.net.remove(k(i));
            }
            NetOp::Duplicate(i) => {
                let f = self.net[k(i)].clone();
                self.send(f);
            }
            NetOp::DeliverAll => {
                let n = self.net.len();
                for _ in 0..n {
                    let Some(f) = self.net.pop_front() else { break };
                    self.deliver(f);
                }
            }
        }
    }

    fn inject_raw(&mut self, body: &[u8]) {
        let Some((&sel, mad)) = body.split_first() else {
            return;
        };
        let to = self.nodes[usize::from(sel & 3) % self.nodes.len()].gid;
        let from = match sel >> 2 {
            0..=31 => self.nodes[usize::from(sel >> 2) % self.nodes.len()].gid,
            x => forged_gid(u32::from(x)),
        };
        self.deliver(Flight {
            from,
            to,
            mad: mad.to_vec(),
        });
    }

    fn mutate(&mut self, u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let m = Mutation::arbitrary(u)?;
        tr!("  {m:?}");
        let mut f = match self.net.len() {
            0 => Flight {
                from: self.nodes[1].gid,
                to: self.nodes[0].gid,
                mad: CmMad::new(1, CmMessage::Rtu(Rtu::default()))
                    .emit()
                    .to_vec(),
            },
            n => self.net[usize::from(m.idx) % n].clone(),
        };
        if let Some(t) = m.to {
            f.to = self.nodes[self.node(t)].gid;
        }
        if let Some(p) = m.from {
            f.from = self.peer(p);
        }
        // The rest: (offset, value) pairs; offsets past 255 truncate the MAD there.
        while u.len() >= 2 {
            let off = usize::from(u8::arbitrary(u)?);
            let val = u8::arbitrary(u)?;
            if off < f.mad.len() {
                f.mad[off] = val;
            }
        }
        if let Some(&t) = u.bytes(u.len())?.first() {
            f.mad.truncate(usize::from(t).max(24));
        }
        self.deliver(f);
        Ok(())
    }

    fn craft(&mut self, u: &mut Unstructured<'_>) -> arbitrary::Result<()> {
        let s = CraftSpec::arbitrary(u)?;
        tr!("  {s:?}");
        let to = self.node(s.to);
        let from = self.peer(s.from);
        let sender = match s.from {
            PeerSel::Node(n) => Some(self.node(n)),
            PeerSel::Forged(_) => None,
        };
        let ours = self.id(to, s.ours).0;
        let theirs = match (sender, s.theirs) {
            (Some(j), sel) => self.id(j, sel).0,
            (None, IdSel::Known(k)) => u32::from(k),
            (None, IdSel::Raw(r)) => r,
        };
        let sender_guid = sender.map_or(0x5EED, |j| self.nodes[j].guid);
        let msg = match s.craft {
            Craft::Req {
                service: sv,
                qpn,
                psn,
                mtu: m,
                transport,
                right_gid,
                local_cm_response_timeout,
                max_cm_retries,
                sender_guid: sg,
                private_qpn,
            } => {
                let mut private_data = [0u8; 92];
                private_data[..4].copy_from_slice(&private_qpn.to_be_bytes());
                CmMessage::Req(Req {
                    local_comm_id: theirs,
                    service_id: service(sv),
                    local_ca_guid: if sg {
                        sender_guid
                    } else {
                        u64::from(qpn) << 20
                    },
                    local_qpn: QpNum::new(qpn),
                    starting_psn: Psn::new(psn),
                    transport_service_type: transport % 4,
                    path_mtu: PathMtu::from_enum(m % 7),
                    local_cm_response_timeout: local_cm_response_timeout % 32,
                    remote_cm_response_timeout: 20,
                    max_cm_retries: max_cm_retries % 16,
                    pkey: 0xFFFF,
                    primary_path: CmPath {
                        local_gid: from,
                        remote_gid: if right_gid {
                            self.nodes[to].gid
                        } else {
                            forged_gid(qpn)
                        },
                        hop_limit: 64,
                        ..CmPath::default()
                    },
                    private_data,
                    ..Req::default()
                })
            }
            Craft::Mra {
                msg,
                service_timeout,
            } => CmMessage::Mra(Mra {
                local_comm_id: theirs,
                remote_comm_id: ours,
                msg_mraed: TargetMsg::from_bits(msg),
                service_timeout: service_timeout % 32,
                ..Mra::default()
            }),
            Craft::Rej {
                msg,
                reason,
                guid_in_ari,
            } => {
                let mut rej = Rej {
                    local_comm_id: theirs,
                    remote_comm_id: ours,
                    msg_rejected: TargetMsg::from_bits(msg),
                    reason: RejReason::from_code(reason % 40),
                    ..Rej::default()
                };
                if guid_in_ari {
                    rej.ari[..8].copy_from_slice(&sender_guid.to_be_bytes());
                    rej.reject_info_len = 8;
                }
                CmMessage::Rej(rej)
            }
            Craft::Rep {
                qpn,
                psn,
                mtu: m,
                sender_guid: sg,
            } => {
                let mut private_data = [0u8; 196];
                private_data[..4].copy_from_slice(&qpn.to_be_bytes());
                private_data[4..8].copy_from_slice(&m.to_be_bytes());
                CmMessage::Rep(Rep {
                    local_comm_id: theirs,
                    remote_comm_id: ours,
                    local_qpn: QpNum::new(qpn),
                    starting_psn: Psn::new(psn),
                    target_ack_delay: 15,
                    rnr_retry_count: 7,
                    local_ca_guid: if sg { sender_guid } else { u64::from(psn) },
                    private_data,
                    ..Rep::default()
                })
            }
            Craft::Rtu => CmMessage::Rtu(Rtu {
                local_comm_id: theirs,
                remote_comm_id: ours,
                ..Rtu::default()
            }),
            Craft::Dreq { right_qpn, qpn } => CmMessage::Dreq(Dreq {
                local_comm_id: theirs,
                remote_comm_id: ours,
                remote_qpn: if right_qpn {
                    self.nodes[to]
                        .qpns
                        .get(&CommId(ours))
                        .copied()
                        .unwrap_or(QpNum::new(qpn))
                } else {
                    QpNum::new(qpn)
                },
                ..Dreq::default()
            }),
            Craft::Drep => CmMessage::Drep(Drep {
                local_comm_id: theirs,
                remote_comm_id: ours,
                ..Drep::default()
            }),
        };
        let mad = CmMad::new(s.tid, msg).emit();
        self.deliver(Flight {
            from,
            to: self.nodes[to].gid,
            mad: mad.to_vec(),
        });
        Ok(())
    }

    // ---------------------------------------------------------------------------------------
    // Time

    fn advance(&mut self, ms: u32, skip_timers: bool) {
        self.now += Duration::from_millis(u64::from(ms % 100_001));
        if !skip_timers {
            self.fire();
        }
    }

    fn jump_to_next_timer(&mut self) {
        if let Some(t) = self.nodes.iter().filter_map(|n| n.cm.poll_timeout()).min() {
            self.now = self.now.max(t);
        }
        self.fire();
    }

    fn op(&mut self, tag: u8, body: &[u8]) {
        let mut u = Unstructured::new(body);
        tr!(
            "op {} ({} bytes) at {:?}",
            tag % 13,
            body.len(),
            self.now - self.start
        );
        let _ = (|| -> arbitrary::Result<()> {
            match tag % 13 {
                0 => {
                    let s = ConnectSpec::arbitrary(&mut u)?;
                    tr!("  {s:?}");
                    self.connect(&s);
                }
                1 => {
                    let s = AcceptSpec::arbitrary(&mut u)?;
                    tr!("  {s:?}");
                    self.accept(&s);
                }
                2 => {
                    let (n, id, reason) = <(u8, IdSel, u16)>::arbitrary(&mut u)?;
                    let i = self.node(n);
                    let id = self.id(i, id);
                    self.reject(i, id, reason);
                }
                3..=5 => {
                    let (n, id) = <(u8, IdSel)>::arbitrary(&mut u)?;
                    let i = self.node(n);
                    let id = self.id(i, id);
                    match tag % 13 {
                        3 => self.rtu(i, id),
                        4 => self.notify_comm_est(i, id),
                        _ => self.disconnect(i, id),
                    }
                }
                6 => {
                    let (n, sv, mask) = <(u8, ServiceSel, MaskSel)>::arbitrary(&mut u)?;
                    let mask = match mask {
                        MaskSel::Exact => u64::MAX,
                        MaskSel::AnyQpn => !0xFF_FFFF,
                        MaskSel::All => 0,
                        MaskSel::Raw(m) => m,
                    };
                    let i = self.node(n);
                    self.nodes[i].cm.listen(service(sv), mask);
                }
                7 => {
                    let op = NetOp::arbitrary(&mut u)?;
                    tr!("  {op:?}");
                    self.net(&op);
                }
                8 => self.inject_raw(body),
                9 => self.mutate(&mut u)?,
                10 => self.craft(&mut u)?,
                11 => {
                    let (ms, skip_timers) = <(u32, bool)>::arbitrary(&mut u)?;
                    self.advance(ms, skip_timers);
                }
                _ => self.jump_to_next_timer(),
            }
            Ok(())
        })();
        self.check();
    }

    /// Delivers everything in flight and runs every timer until none is left.
    fn settle(&mut self, what: &str) {
        let begin = self.now;
        for _ in 0..SETTLE_STEPS {
            if let Some(f) = self.net.pop_front() {
                self.deliver(f);
                self.check();
                continue;
            }
            let Some(t) = self.nodes.iter().filter_map(|n| n.cm.poll_timeout()).min() else {
                return;
            };
            self.now = self.now.max(t);
            assert!(
                self.now - begin <= SETTLE_BOUND,
                "{what}: timers still running after {:?}",
                self.now - begin
            );
            self.fire();
            self.check();
        }
        panic!("{what}: no quiet after {SETTLE_STEPS} steps");
    }

    fn dump(&self) {
        for (i, n) in self.nodes.iter().enumerate() {
            eprintln!("node {i}: len {} stats {:?}", n.cm.len(), n.cm.stats());
            for id in &n.ids {
                if let Some(s) = n.cm.state(*id) {
                    eprintln!("  {id:?}: {s:?}");
                }
            }
        }
    }

    fn finish(&mut self) {
        // Make every timer that was due run, then settle without the owner.
        self.fire();
        self.check();
        self.settle("settle without the owner");
        if trace() {
            eprintln!("after the first settle:");
            self.dump();
        }
        for (i, n) in self.nodes.iter().enumerate() {
            assert_eq!(n.cm.poll_timeout(), None, "node {i}");
            for id in &n.ids {
                if let Some(s) = n.cm.state(*id) {
                    assert!(
                        matches!(
                            s,
                            CmState::ReqRcvd | CmState::RepRcvd | CmState::Established
                        ),
                        "node {i}: {id:?} stuck in {s:?} with no timer"
                    );
                }
            }
        }
        // The owner closes what is left; then everything is freed.
        for i in 0..self.nodes.len() {
            let ids: Vec<CommId> = self.nodes[i].ids.clone();
            for id in ids {
                if self.nodes[i].cm.state(id).is_some() {
                    self.disconnect(i, id);
                }
            }
        }
        self.check();
        self.settle("settle after disconnecting everything");
        if trace() {
            eprintln!("end:");
            self.dump();
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let left: Vec<_> = n
                .ids
                .iter()
                .filter_map(|id| n.cm.state(*id).map(|s| (*id, s)))
                .collect();
            assert!(
                n.cm.is_empty(),
                "node {i}: ids left after disconnect and settle: {left:?}"
            );
        }
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
    let mut h = Harness::new(&setup, Instant::now());
    for (tag, body) in it.take(MAX_OPS) {
        h.op(tag, body);
    }
    h.finish();
});
