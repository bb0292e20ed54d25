//! [`PortWatch`]: what a port's firmware tells its driver, learnt from the port's own Subnet
//! Management Agent, for a port that has no firmware of its own (a software port on ibsim's
//! simulated fabric).
//!
//! An HCA's driver reports port events (`IBV_EVENT_PORT_ACTIVE`, `PORT_ERR`, `LID_CHANGE`,
//! `SM_CHANGE`, `PKEY_CHANGE`, `CLIENT_REREGISTER`) when the SM writes the port's PortInfo or
//! P_Key table. A simulated port sees no such write; it asks its SMA (directed route, hop
//! count 0) for `NodeInfo` once and for `PortInfo` and the P_Key table every
//! [`PortWatchConfig::period`], and reports what changed between two reads as the event an
//! HCA would have raised ([`PortEvent`]).
//!
//! The SM's ClientReregister bit is reported where a read sees it; ibsim's SMA does not keep
//! it, so the caller that learns by other means that the SM lost the port's registrations
//! (the SA no longer lists a membership the port holds) says so with
//! [`PortWatch::reregister_inferred`].
//!
//! # Invariants
//! - At most one SMP is outstanding; an unanswered one is given up after
//!   [`PortWatchConfig::request_timeout`] and the read is tried again at the next period.
//! - The P_Key table read is bounded by [`PortWatchConfig::max_pkey_blocks`] blocks.
//! - After [`PortWatchConfig::max_silent_reads`] reads in a row got no answer, an active port
//!   is reported down (the SMA is the port: if it does not answer, nothing else will).
//! - The first complete read raises no event: it is the port as found ([`PortWatch::port`]).
//! - A port that leaves `Active` raises `PortDown` and nothing else; one that enters it raises
//!   `PortUp`; between two active reads a LID or LMC change raises `LidChange`, an SM LID or
//!   SL change `SmChange`, a changed P_Key table `PkeyChange`, a set ClientReregister bit
//!   `ClientReregister`, in that order.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{PortEvent, SmAddress};
use crate::wire::smp::{
    NodeInfo, PkeyBlock, PortInfo, PortState, Smp, ATTR_NODE_INFO, ATTR_PKEY_TABLE, ATTR_PORT_INFO,
    PKEYS_PER_BLOCK, SMP_LEN,
};
use crate::wire::{Gid, PathMtu};

/// Events held for the caller at most; the oldest goes first when more are raised.
const MAX_EVENTS: usize = 16;

/// How often and how patiently a [`PortWatch`] reads its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortWatchConfig {
    /// Time between two reads of PortInfo and the P_Key table.
    pub period: Duration,
    /// How long one SMP waits for its answer.
    pub request_timeout: Duration,
    /// Most P_Key table blocks read (32 entries each).
    pub max_pkey_blocks: u16,
    /// Reads in a row without an answer after which an active port is reported down.
    pub max_silent_reads: u32,
}

impl Default for PortWatchConfig {
    /// A read every 250 ms, 100 ms for an answer, 4 P_Key blocks (128 entries, what HCAs
    /// have), down after 8 silent reads (2 s).
    fn default() -> Self {
        Self {
            period: Duration::from_millis(250),
            request_timeout: Duration::from_millis(100),
            max_pkey_blocks: 4,
            max_silent_reads: 8,
        }
    }
}

/// The port as its last complete read found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSnapshot {
    /// The port's GUID (NodeInfo).
    pub port_guid: u64,
    /// The port's PortInfo.
    pub info: PortInfo,
    /// The P_Key table's entries, in table order (trailing unused ones left off, so an
    /// entry's position is its index).
    pub pkey_table: Vec<u16>,
}

impl PortSnapshot {
    /// The port's default GID: the subnet prefix and the port GUID.
    #[must_use]
    pub fn gid(&self) -> Gid {
        let mut g = [0u8; 16];
        g[..8].copy_from_slice(&self.info.gid_prefix.to_be_bytes());
        g[8..].copy_from_slice(&self.port_guid.to_be_bytes());
        Gid(g)
    }

    /// The SM's address as the port knows it.
    #[must_use]
    pub const fn sm(&self) -> SmAddress {
        SmAddress {
            lid: self.info.sm_lid,
            sl: self.info.sm_sl,
        }
    }

    /// Whether the port is `Active`.
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.info.state == PortState::Active
    }

    /// The active MTU.
    #[must_use]
    pub const fn mtu(&self) -> Option<PathMtu> {
        self.info.active_mtu()
    }
}

/// What a [`PortWatch`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct PortWatchCounters {
    /// SMPs sent.
    pub smps_sent: u64,
    /// SMPs that got no answer in time.
    pub smp_timeouts: u64,
    /// Answers with an error status, or that matched nothing outstanding.
    pub smps_refused: u64,
    /// Complete reads of the port.
    pub reads: u64,
    /// Port events raised.
    pub events: u64,
    /// ClientReregister events raised on the caller's inference.
    pub reregisters_inferred: u64,
    /// Events dropped because 16 were waiting for the caller (the oldest goes).
    pub events_dropped: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Query {
    NodeInfo,
    PortInfo,
    Pkeys(u16),
}

#[derive(Debug, Clone)]
struct Round {
    info: Option<PortInfo>,
    pkeys: Vec<u16>,
}

/// Watches one port through its SMA; see the [module docs](self).
#[derive(Debug)]
pub struct PortWatch {
    cfg: PortWatchConfig,
    node: Option<NodeInfo>,
    port: Option<PortSnapshot>,
    round: Option<Round>,
    outstanding: Option<(u32, Query, Instant)>,
    next_read: Instant,
    silent_reads: u32,
    next_tid: u32,
    out: VecDeque<[u8; SMP_LEN]>,
    events: VecDeque<PortEvent>,
    counters: PortWatchCounters,
}

impl PortWatch {
    /// A watch whose first read starts at `now`.
    #[must_use]
    pub fn new(cfg: PortWatchConfig, now: Instant) -> Self {
        Self {
            cfg,
            node: None,
            port: None,
            round: None,
            outstanding: None,
            next_read: now,
            silent_reads: 0,
            next_tid: 1,
            out: VecDeque::new(),
            events: VecDeque::new(),
            counters: PortWatchCounters::default(),
        }
    }

    /// The port as last read; `None` before the first complete read.
    #[must_use]
    pub fn port(&self) -> Option<&PortSnapshot> {
        self.port.as_ref()
    }

    /// The counters.
    #[must_use]
    pub fn counters(&self) -> PortWatchCounters {
        self.counters
    }

    /// The next SMP to send to the port's own SMA (QP0, directed route, permissive DLID).
    pub fn pop_transmit(&mut self) -> Option<[u8; SMP_LEN]> {
        self.out.pop_front()
    }

    /// The next port event.
    pub fn pop_event(&mut self) -> Option<PortEvent> {
        self.events.pop_front()
    }

    /// Whether an SMP awaits its answer.
    #[must_use]
    pub fn is_waiting(&self) -> bool {
        self.outstanding.is_some()
    }

    /// When [`poll_timeout`](Self::poll_timeout) has work next.
    #[must_use]
    pub fn next_deadline(&self) -> Instant {
        match self.outstanding {
            Some((_, _, sent)) => sent + self.cfg.request_timeout,
            None => self.next_read,
        }
    }

    /// Reads the port again now rather than at the next period (something suggests it
    /// changed).
    pub fn read_soon(&mut self, now: Instant) {
        if self.round.is_none() {
            self.next_read = self.next_read.min(now);
        }
    }

    /// The caller learnt that the SM lost the port's registrations (its ClientReregister bit
    /// is not kept by this port's SMA): raises `ClientReregister` if the port is active.
    pub fn reregister_inferred(&mut self) {
        if self.port.as_ref().is_some_and(PortSnapshot::is_active) {
            self.counters.reregisters_inferred += 1;
            self.raise(PortEvent::ClientReregister);
        }
    }

    /// Gives up an unanswered SMP and starts a read whose time has come.
    pub fn poll_timeout(&mut self, now: Instant) {
        if let Some((_, _, sent)) = self.outstanding {
            if now < sent + self.cfg.request_timeout {
                return;
            }
            self.outstanding = None;
            self.round = None;
            self.counters.smp_timeouts += 1;
            self.silent_reads = self.silent_reads.saturating_add(1);
            if self.silent_reads == self.cfg.max_silent_reads {
                self.port_unreachable();
            }
        }
        if self.round.is_none() && now >= self.next_read {
            self.next_read = now + self.cfg.period;
            self.round = Some(Round {
                info: None,
                pkeys: Vec::new(),
            });
            let first = if self.node.is_some() {
                Query::PortInfo
            } else {
                Query::NodeInfo
            };
            self.send(now, first);
        }
    }

    /// An SMP that arrived on the agent (the umad header removed).
    pub fn handle_mad(&mut self, now: Instant, buf: &[u8]) {
        let Ok(smp) = Smp::parse(buf) else {
            self.counters.smps_refused += 1;
            return;
        };
        let tid = (smp.transaction_id & 0xFFFF_FFFF) as u32;
        let Some((want, query, _)) = self.outstanding else {
            self.counters.smps_refused += 1;
            return;
        };
        if tid != want || !smp.is_get_resp() {
            self.counters.smps_refused += 1;
            return;
        }
        self.outstanding = None;
        self.silent_reads = 0;
        let ok = smp.status == 0;
        if !ok {
            self.counters.smps_refused += 1;
        }
        match query {
            Query::NodeInfo if ok => {
                self.node = Some(NodeInfo::from_bytes(&smp.data));
                self.send(now, Query::PortInfo);
            }
            Query::PortInfo if ok => {
                if let Some(r) = self.round.as_mut() {
                    r.info = Some(PortInfo::from_bytes(&smp.data));
                }
                self.next_pkeys(now, 0);
            }
            Query::NodeInfo | Query::PortInfo => self.round = None,
            Query::Pkeys(block) => {
                // A refused block ends the table (past the port's PartitionCap).
                if ok {
                    if let Some(r) = self.round.as_mut() {
                        r.pkeys.extend(PkeyBlock::from_bytes(&smp.data).0);
                    }
                    self.next_pkeys(now, block.saturating_add(1));
                } else {
                    self.finish_round();
                }
            }
        }
    }

    /// Asks for P_Key block `block` if the table has one, else ends the read.
    fn next_pkeys(&mut self, now: Instant, block: u16) {
        let cap = self.node.map_or(0, |n| n.partition_cap);
        let blocks = cap
            .div_ceil(PKEYS_PER_BLOCK as u16)
            .min(self.cfg.max_pkey_blocks);
        if block < blocks {
            self.send(now, Query::Pkeys(block));
        } else {
            self.finish_round();
        }
    }

    fn send(&mut self, now: Instant, q: Query) {
        let tid = self.next_tid;
        self.next_tid = self.next_tid.wrapping_add(1).max(1);
        let (attr, modifier) = match q {
            Query::NodeInfo => (ATTR_NODE_INFO, 0),
            Query::PortInfo => (ATTR_PORT_INFO, 0),
            Query::Pkeys(b) => (ATTR_PKEY_TABLE, u32::from(b)),
        };
        self.out
            .push_back(Smp::get_local(attr, modifier, u64::from(tid)).emit());
        self.outstanding = Some((tid, q, now));
        self.counters.smps_sent += 1;
    }

    fn finish_round(&mut self) {
        let Some(round) = self.round.take() else {
            return;
        };
        let (Some(info), Some(node)) = (round.info, self.node) else {
            return;
        };
        let mut pkey_table = round.pkeys;
        while pkey_table.last().is_some_and(|k| k & 0x7FFF == 0) {
            pkey_table.pop();
        }
        let new = PortSnapshot {
            port_guid: node.port_guid,
            info,
            pkey_table,
        };
        self.counters.reads += 1;
        if let Some(old) = self.port.take() {
            self.compare(&old, &new);
        }
        self.port = Some(new);
    }

    fn compare(&mut self, old: &PortSnapshot, new: &PortSnapshot) {
        match (old.is_active(), new.is_active()) {
            (true, false) => self.raise(PortEvent::PortDown),
            (false, true) => self.raise(PortEvent::PortUp(new.sm())),
            (false, false) => {}
            (true, true) => {
                let (a, b) = (&old.info, &new.info);
                if (a.lid, a.lmc) != (b.lid, b.lmc) {
                    self.raise(PortEvent::LidChange);
                }
                if (a.sm_lid, a.sm_sl) != (b.sm_lid, b.sm_sl) {
                    self.raise(PortEvent::SmChange(new.sm()));
                }
                if old.pkey_table != new.pkey_table {
                    self.raise(PortEvent::PkeyChange);
                }
                if b.client_reregister {
                    self.raise(PortEvent::ClientReregister);
                }
            }
        }
    }

    /// The SMA stopped answering: an active port is taken for down.
    fn port_unreachable(&mut self) {
        if let Some(p) = self.port.as_mut().filter(|p| p.is_active()) {
            p.info.state = PortState::Down;
            self.raise(PortEvent::PortDown);
        }
    }

    fn raise(&mut self, ev: PortEvent) {
        self.counters.events += 1;
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
            self.counters.events_dropped += 1;
        }
        self.events.push_back(ev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::smp::{METHOD_GET_RESP, SMP_DATA_LEN};

    /// A port's SMA as ibsim keeps it: NodeInfo, PortInfo and a P_Key table.
    struct Sma {
        node: NodeInfo,
        info: PortInfo,
        pkeys: Vec<u16>,
        /// Answer nothing (a port, or a simulator, gone).
        mute: bool,
    }

    impl Sma {
        fn hca2() -> Self {
            Self {
                node: NodeInfo {
                    node_type: 1,
                    num_ports: 2,
                    node_guid: 0x20_0000,
                    port_guid: 0x20_0001,
                    partition_cap: 64,
                    local_port: 1,
                },
                info: PortInfo::from_bytes(&{
                    let mut d = [0u8; SMP_DATA_LEN];
                    d[8] = 0xfe;
                    d[9] = 0x80;
                    d
                }),
                pkeys: vec![0xffff],
                mute: false,
            }
            .active(4, 1)
        }

        fn active(mut self, lid: u16, sm_lid: u16) -> Self {
            self.info.lid = lid;
            self.info.sm_lid = sm_lid;
            self.info.state = PortState::Active;
            self.info.neighbor_mtu = 4;
            self
        }

        fn answer(&self, req: &[u8; SMP_LEN]) -> Option<[u8; SMP_LEN]> {
            if self.mute {
                return None;
            }
            let mut s = Smp::parse(req).ok()?;
            s.method = METHOD_GET_RESP;
            s.direction_in = true;
            match s.attr_id {
                ATTR_NODE_INFO => s.data = self.node.to_bytes(),
                ATTR_PORT_INFO => s.data = self.info.to_bytes(),
                ATTR_PKEY_TABLE => {
                    let from = s.attr_mod as usize * PKEYS_PER_BLOCK;
                    if from >= usize::from(self.node.partition_cap) {
                        s.status = 0x1c;
                    } else {
                        let mut b = [0u16; PKEYS_PER_BLOCK];
                        for (i, k) in b.iter_mut().enumerate() {
                            *k = self.pkeys.get(from + i).copied().unwrap_or(0);
                        }
                        s.data = PkeyBlock(b).to_bytes();
                    }
                }
                _ => s.status = 0x0c,
            }
            Some(s.emit())
        }
    }

    /// Runs the watch against `sma` from `*now` for `d`, in 10 ms steps; the events raised.
    fn run(w: &mut PortWatch, sma: &Sma, now: &mut Instant, d: Duration) -> Vec<PortEvent> {
        let end = *now + d;
        let mut evs = Vec::new();
        while *now < end {
            w.poll_timeout(*now);
            // An answer may ask the next question: bounded by the P_Key blocks and two more.
            for _ in 0..8 {
                let Some(req) = w.pop_transmit() else { break };
                if let Some(resp) = sma.answer(&req) {
                    w.handle_mad(*now, &resp);
                }
            }
            evs.extend(std::iter::from_fn(|| w.pop_event()));
            *now += Duration::from_millis(10);
        }
        evs
    }

    fn start(sma: &Sma) -> (PortWatch, Instant) {
        let mut now = Instant::now();
        let mut w = PortWatch::new(PortWatchConfig::default(), now);
        assert_eq!(run(&mut w, sma, &mut now, Duration::from_millis(50)), []);
        (w, now)
    }

    #[test]
    fn the_first_read_is_the_port_as_found() {
        let sma = Sma::hca2();
        let (w, _) = start(&sma);
        let p = w.port().expect("read");
        assert_eq!((p.info.lid, p.sm().lid, p.port_guid), (4, 1, 0x20_0001));
        assert_eq!(p.gid().0[..2], [0xfe, 0x80]);
        assert_eq!(p.gid().0[8..], 0x20_0001u64.to_be_bytes());
        assert_eq!(p.mtu(), Some(PathMtu::Mtu2048));
        assert_eq!(p.pkey_table, vec![0xffff]);
        // NodeInfo, PortInfo, two P_Key blocks (PartitionCap 64).
        assert_eq!(w.counters().smps_sent, 4);
    }

    #[test]
    fn what_the_sm_changes_becomes_the_event_an_hca_raises() {
        let mut sma = Sma::hca2();
        let (mut w, mut now) = start(&sma);
        let second = Duration::from_secs(1);
        assert_eq!(run(&mut w, &sma, &mut now, second), []);

        sma.info.lid = 9;
        assert_eq!(run(&mut w, &sma, &mut now, second), [PortEvent::LidChange]);

        sma.info.sm_lid = 2;
        sma.info.sm_sl = 1;
        let sm = SmAddress { lid: 2, sl: 1 };
        assert_eq!(
            run(&mut w, &sma, &mut now, second),
            [PortEvent::SmChange(sm)]
        );

        sma.pkeys.push(0x8001);
        assert_eq!(run(&mut w, &sma, &mut now, second), [PortEvent::PkeyChange]);
        assert_eq!(w.port().expect("read").pkey_table, vec![0xffff, 0x8001]);

        sma.info.client_reregister = true;
        let evs = run(&mut w, &sma, &mut now, Duration::from_millis(260));
        assert_eq!(evs.first(), Some(&PortEvent::ClientReregister));
        sma.info.client_reregister = false;

        sma.info.state = PortState::Init;
        sma.info.lid = 0;
        assert_eq!(run(&mut w, &sma, &mut now, second), [PortEvent::PortDown]);

        sma.info.state = PortState::Active;
        sma.info.lid = 12;
        assert_eq!(
            run(&mut w, &sma, &mut now, second),
            [PortEvent::PortUp(sm)],
            "an HCA that comes back says only that"
        );
        assert_eq!(w.port().expect("read").info.lid, 12);
    }

    #[test]
    fn an_sma_that_stops_answering_takes_the_port_down_once() {
        let mut sma = Sma::hca2();
        let (mut w, mut now) = start(&sma);
        sma.mute = true;
        let evs = run(&mut w, &sma, &mut now, Duration::from_secs(5));
        assert_eq!(evs, [PortEvent::PortDown]);
        assert!(w.counters().smp_timeouts >= 8);
        sma.mute = false;
        let evs = run(&mut w, &sma, &mut now, Duration::from_secs(1));
        assert_eq!(evs, [PortEvent::PortUp(SmAddress { lid: 1, sl: 0 })]);
    }

    #[test]
    fn an_inferred_reregister_is_raised_only_on_an_active_port() {
        let mut sma = Sma::hca2();
        let (mut w, mut now) = start(&sma);
        w.reregister_inferred();
        assert_eq!(w.pop_event(), Some(PortEvent::ClientReregister));
        sma.info.state = PortState::Down;
        assert_eq!(
            run(&mut w, &sma, &mut now, Duration::from_secs(1)),
            [PortEvent::PortDown]
        );
        w.reregister_inferred();
        assert_eq!(w.pop_event(), None);
        assert_eq!(w.counters().reregisters_inferred, 1);
    }

    #[test]
    fn answers_that_match_nothing_are_counted_and_change_nothing() {
        let sma = Sma::hca2();
        let (mut w, now) = start(&sma);
        let before = w.port().cloned();
        let mut stray = Smp::get_local(ATTR_PORT_INFO, 0, 0xdead);
        stray.method = METHOD_GET_RESP;
        w.handle_mad(now, &stray.emit());
        w.handle_mad(now, &[0u8; 10]);
        assert_eq!(w.counters().smps_refused, 2);
        assert_eq!(w.port().cloned(), before);
    }
}
