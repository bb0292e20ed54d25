//! Several [`Cm`]s on an in-memory MAD network with a virtual clock and seeded, deterministic
//! loss: every lost message of the connect/disconnect exchanges is recovered, lossy cycles
//! converge, simultaneous connects and crossing disconnects work, a dead peer times out when
//! the formula says, and forged MADs from a third GID change nothing.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use ipoib_cm::cm::{AcceptParams, Cm, CmConfig, CmEvent, CmState, CommId, ConnectParams};
use ipoib_cm::verbs::{Gid, PathMtu, Psn, QpNum};
use ipoib_cm::wire::cm::{AttrId, CmMad, CmMessage, Dreq, Rej, RejReason, TargetMsg};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SID: u64 = 0x1000_0000_0000_0100;
const LATENCY: Duration = Duration::from_millis(1);
const TIMEWAIT: Duration = Duration::from_millis(100);

fn gid(n: u8) -> Gid {
    Gid::from(Ipv4Addr::new(10, 0, 0, n))
}

/// One port: its CM and an owner that accepts every REQ and answers every REP with RTU.
struct Node {
    gid: Gid,
    cm: Cm,
    events: Vec<(Instant, CmEvent)>,
    next_qpn: u32,
}

/// A MAD in flight.
struct InFlight {
    at: Instant,
    from: Gid,
    to: Gid,
    mad: [u8; 256],
}

/// The network: nodes, MADs in flight, the virtual clock and the loss model.
struct Net {
    now: Instant,
    nodes: Vec<Node>,
    wire: VecDeque<InFlight>,
    rng: ChaCha8Rng,
    /// Probability that any MAD is lost.
    loss: f64,
    /// Lose the next `n` MADs of this attribute.
    drop_next: Vec<(AttrId, usize)>,
    /// Lose everything.
    blackhole: bool,
    /// MADs put on the wire (after loss), by attribute.
    delivered: Vec<AttrId>,
}

impl Net {
    fn new(n: u8, seed: u64) -> Self {
        let t0 = Instant::now();
        let nodes = (1..=n)
            .map(|i| {
                let mut cfg = CmConfig::new(gid(i), 0xCA00 + u64::from(i));
                cfg.timewait = TIMEWAIT;
                cfg.comm_id_seed = u32::from(i) << 16;
                let mut cm = Cm::new(cfg);
                cm.listen(SID, u64::MAX);
                Node {
                    gid: gid(i),
                    cm,
                    events: Vec::new(),
                    next_qpn: u32::from(i) << 12,
                }
            })
            .collect();
        Self {
            now: t0,
            nodes,
            wire: VecDeque::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            loss: 0.0,
            drop_next: Vec::new(),
            blackhole: false,
            delivered: Vec::new(),
        }
    }

    fn node(&mut self, i: usize) -> &mut Node {
        &mut self.nodes[i]
    }

    fn connect(&mut self, from: usize, to: usize) -> CommId {
        let now = self.now;
        let peer = self.nodes[to].gid;
        let n = &mut self.nodes[from];
        n.next_qpn += 1;
        let p = ConnectParams {
            peer,
            service_id: SID,
            local_qpn: QpNum::new(n.next_qpn),
            starting_psn: Psn::new(n.next_qpn * 7),
            path_mtu: PathMtu::Mtu1024,
            retry_count: 0,
            rnr_retry_count: 0,
            srq: true,
            local_ack_timeout: 17,
            private_data: vec![],
            path: None,
        };
        n.cm.connect(now, p).unwrap()
    }

    /// Whether this MAD is lost.
    fn lose(&mut self, mad: &[u8; 256]) -> bool {
        if self.blackhole {
            return true;
        }
        let attr = CmMad::parse(mad).unwrap().msg.attr_id();
        if let Some((_, n)) = self
            .drop_next
            .iter_mut()
            .find(|(a, n)| *a == attr && *n > 0)
        {
            *n -= 1;
            return true;
        }
        if self.loss > 0.0 && self.rng.gen_bool(self.loss) {
            return true;
        }
        self.delivered.push(attr);
        false
    }

    /// Does everything due at `now`; true if anything happened.
    fn settle(&mut self) -> bool {
        let mut any = false;
        for _ in 0..10_000 {
            let mut progress = false;
            for i in 0..self.nodes.len() {
                let now = self.now;
                self.nodes[i].cm.handle_timeout(now);
                while let Some((to, mad)) = self.nodes[i].cm.poll_transmit() {
                    progress = true;
                    if !self.lose(&mad) {
                        let from = self.nodes[i].gid;
                        self.wire.push_back(InFlight {
                            at: now + LATENCY,
                            from,
                            to,
                            mad,
                        });
                    }
                }
                let n = &mut self.nodes[i];
                while let Some(ev) = n.cm.poll_event() {
                    progress = true;
                    match ev {
                        CmEvent::ReqReceived { id, .. } => {
                            n.next_qpn += 1;
                            let p = AcceptParams {
                                local_qpn: QpNum::new(n.next_qpn),
                                starting_psn: Psn::new(n.next_qpn * 3),
                                srq: true,
                                rnr_retry_count: 0,
                                private_data: vec![],
                            };
                            n.cm.accept(now, id, p).unwrap();
                        }
                        CmEvent::RepReceived { id, .. } => n.cm.rtu(now, id).unwrap(),
                        _ => {}
                    }
                    n.events.push((now, ev));
                }
            }
            while let Some(pos) = self.wire.iter().position(|m| m.at <= self.now) {
                progress = true;
                let Some(m) = self.wire.remove(pos) else {
                    break;
                };
                let now = self.now;
                if let Some(n) = self.nodes.iter_mut().find(|n| n.gid == m.to) {
                    n.cm.handle_mad(now, m.from, &m.mad);
                }
            }
            if !progress {
                return any;
            }
            any = true;
        }
        panic!("no quiescence at one instant");
    }

    /// The next instant anything is due.
    fn next_wakeup(&self) -> Option<Instant> {
        let wire = self.wire.iter().map(|m| m.at).min();
        let timers = self.nodes.iter().filter_map(|n| n.cm.poll_timeout()).min();
        [wire, timers].into_iter().flatten().min()
    }

    /// Runs until `done` holds (checked whenever the network is quiet at an instant), at most
    /// `max_steps` clock jumps. Returns whether `done` held.
    fn run_until(&mut self, max_steps: usize, mut done: impl FnMut(&Self) -> bool) -> bool {
        for _ in 0..max_steps {
            self.settle();
            if done(self) {
                return true;
            }
            match self.next_wakeup() {
                Some(t) => self.now = self.now.max(t),
                None => return done(self),
            }
        }
        false
    }

    /// Runs until nothing is in flight and no timer is pending.
    fn run_idle(&mut self, max_steps: usize) -> bool {
        self.run_until(max_steps, |n| n.next_wakeup().is_none())
    }

    fn state(&self, i: usize, id: CommId) -> Option<CmState> {
        self.nodes[i].cm.state(id)
    }

    fn has_event(&self, i: usize, ev: &CmEvent) -> bool {
        self.nodes[i].events.iter().any(|(_, e)| e == ev)
    }

    /// The passive id node `i` made for the latest REQ, if any.
    fn passive(&self, i: usize) -> Option<CommId> {
        self.nodes[i]
            .events
            .iter()
            .rev()
            .find_map(|(_, e)| match e {
                CmEvent::ReqReceived { id, .. } => Some(*id),
                _ => None,
            })
    }

    /// The passive id node `i` made for the latest REQ.
    fn last_passive(&self, i: usize) -> CommId {
        self.passive(i).expect("a REQ was received")
    }
}

/// Connect 0→1, establish, disconnect from `closer`, wait until every id is gone.
fn full_cycle(net: &mut Net, closer: usize) {
    let ida = net.connect(0, 1);
    assert!(
        net.run_until(10_000, |n| {
            n.state(0, ida) == Some(CmState::Established)
                && n.passive(1).and_then(|id| n.state(1, id)) == Some(CmState::Established)
        }),
        "not established: A {:?}",
        net.state(0, ida)
    );
    let idb = net.last_passive(1);
    let id = if closer == 0 { ida } else { idb };
    let now = net.now;
    net.node(closer).cm.disconnect(now, id).unwrap();
    assert!(net.run_idle(10_000));
    assert_eq!(net.state(0, ida), None);
    assert_eq!(net.state(1, idb), None);
    assert!(net.has_event(0, &CmEvent::TimeWaitExit { id: ida }));
    assert!(net.has_event(1, &CmEvent::TimeWaitExit { id: idb }));
    assert_eq!((net.nodes[0].cm.len(), net.nodes[1].cm.len()), (0, 0));
}

#[test]
fn clean_connect_and_disconnect() {
    let mut net = Net::new(2, 1);
    full_cycle(&mut net, 0);
    assert_eq!(
        net.delivered,
        vec![
            AttrId::Req,
            AttrId::Rep,
            AttrId::Rtu,
            AttrId::Dreq,
            AttrId::Drep
        ]
    );
    assert_eq!(net.nodes[0].cm.stats().retransmits, 0);
}

#[test]
fn each_lost_message_is_recovered() {
    for attr in [
        AttrId::Req,
        AttrId::Rep,
        AttrId::Rtu,
        AttrId::Dreq,
        AttrId::Drep,
    ] {
        let mut net = Net::new(2, 2);
        net.drop_next = vec![(attr, 1)];
        let t0 = net.now;
        full_cycle(&mut net, 0);
        assert_eq!(net.drop_next, vec![(attr, 0)], "{attr:?} was not lost");
        let retx = net.nodes[0].cm.stats().retransmits + net.nodes[1].cm.stats().retransmits;
        assert!(retx >= 1, "{attr:?}: nothing retransmitted");
        // Recovered within one retransmit interval (plus TimeWait).
        assert!(
            net.now - t0 < Duration::from_millis(4608 + 4096 + 1000),
            "{attr:?}"
        );
    }
}

#[test]
fn thirty_percent_loss_over_200_cycles_converges() {
    let mut net = Net::new(2, 0x5EED);
    net.loss = 0.3;
    for cycle in 0..200 {
        full_cycle(&mut net, cycle % 2);
    }
    let s = net.nodes[0].cm.stats();
    assert!(s.retransmits > 0);
    assert_eq!(s.timeouts, 0);
}

#[test]
fn simultaneous_connects_make_two_one_way_connections() {
    let mut net = Net::new(2, 3);
    let ab = net.connect(0, 1);
    let ba = net.connect(1, 0);
    assert!(net.run_until(1000, |n| {
        n.state(0, ab) == Some(CmState::Established)
            && n.state(1, ba) == Some(CmState::Established)
            && n.nodes.iter().all(|n| {
                n.events
                    .iter()
                    .filter(|(_, e)| matches!(e, CmEvent::Established { .. }))
                    .count()
                    == 2
            })
    }));
    assert_eq!((net.nodes[0].cm.len(), net.nodes[1].cm.len()), (2, 2));
}

#[test]
fn crossing_disconnects_converge() {
    let mut net = Net::new(2, 4);
    let ida = net.connect(0, 1);
    assert!(net.run_idle(1000));
    let idb = net.last_passive(1);
    let now = net.now;
    net.node(0).cm.disconnect(now, ida).unwrap();
    net.node(1).cm.disconnect(now, idb).unwrap();
    assert!(net.run_idle(1000));
    assert!(net.has_event(0, &CmEvent::Disconnected { id: ida }));
    assert!(net.has_event(1, &CmEvent::Disconnected { id: idb }));
    assert!(net.has_event(0, &CmEvent::TimeWaitExit { id: ida }));
    assert!(net.has_event(1, &CmEvent::TimeWaitExit { id: idb }));
    assert_eq!(net.nodes[0].cm.stats().retransmits, 0);
}

#[test]
fn dead_peer_times_out_when_the_formula_says() {
    let mut net = Net::new(2, 5);
    net.blackhole = true;
    let t0 = net.now;
    let id = net.connect(0, 1);
    assert!(net.run_idle(1000));
    let cfg = net.nodes[0].cm.config().clone();
    // (1 + max_cm_retries) sends, each waiting 2·conv(packet_life_time) +
    // conv(cm_response_timeout) = 2·256 + 4096 ms.
    let interval = Duration::from_millis(2 * 256 + 4096);
    assert_eq!(cfg.req_timeout(), interval);
    let expected = t0 + interval * (1 + u32::from(cfg.max_cm_retries));
    let timed_out: Vec<_> = net.nodes[0]
        .events
        .iter()
        .filter(|(_, e)| matches!(e, CmEvent::TimedOut { .. }))
        .collect();
    assert_eq!(
        timed_out,
        vec![&(
            expected,
            CmEvent::TimedOut {
                id,
                state: CmState::ReqSent
            }
        )]
    );
    let s = net.nodes[0].cm.stats();
    assert_eq!((s.mads_sent, s.retransmits), (16, 15));
    assert_eq!(net.nodes[0].cm.len(), 0);
}

#[test]
fn forged_dreq_and_rej_from_a_third_gid_change_nothing() {
    let mut net = Net::new(3, 6);
    let ida = net.connect(0, 1);
    assert!(net.run_idle(1000));
    let idb = net.last_passive(1);
    let (qpn_a, qpn_b) = (QpNum::new((1 << 12) + 1), QpNum::new((2 << 12) + 1));
    let forger = net.nodes[2].gid;
    let now = net.now;
    // Every field right except the source GID.
    let to_a = [
        CmMessage::Dreq(Dreq {
            local_comm_id: idb.0,
            remote_comm_id: ida.0,
            remote_qpn: qpn_a,
            ..Dreq::default()
        }),
        CmMessage::Rej(Rej {
            local_comm_id: idb.0,
            remote_comm_id: ida.0,
            msg_rejected: TargetMsg::Other,
            reason: RejReason::ConsumerDefined,
            ..Rej::default()
        }),
    ];
    let to_b = [
        CmMessage::Dreq(Dreq {
            local_comm_id: ida.0,
            remote_comm_id: idb.0,
            remote_qpn: qpn_b,
            ..Dreq::default()
        }),
        CmMessage::Rej(Rej {
            local_comm_id: ida.0,
            remote_comm_id: idb.0,
            msg_rejected: TargetMsg::Other,
            reason: RejReason::StaleConn,
            ..Rej::default()
        }),
    ];
    for m in to_a {
        net.node(0)
            .cm
            .handle_mad(now, forger, &CmMad::new(1, m).emit());
    }
    for m in to_b {
        net.node(1)
            .cm
            .handle_mad(now, forger, &CmMad::new(1, m).emit());
    }
    assert!(net.run_idle(1000));
    assert_eq!(net.state(0, ida), Some(CmState::Established));
    assert_eq!(net.state(1, idb), Some(CmState::Established));
    assert_eq!(net.nodes[0].cm.stats().dropped_spoofed, 2);
    assert_eq!(net.nodes[1].cm.stats().dropped_spoofed, 2);
    assert_eq!(
        net.nodes[2].cm.stats().mads_received,
        0,
        "nothing answered the forger"
    );
    // The genuine peer can still disconnect.
    let now = net.now;
    net.node(1).cm.disconnect(now, idb).unwrap();
    assert!(net.run_idle(1000));
    assert!(net.has_event(0, &CmEvent::DisconnectReceived { id: ida }));
}
