//! A deterministic in-memory fabric for tests: several [`SoftVerbs`] nodes joined by a wire
//! with a fixed latency and a virtual clock.
//!
//! A directed link between two nodes may be impaired ([`Fabric::impair`]) as a netem
//! between them would: a one-way delay, jitter, reordering and loss, all drawn from a seeded
//! RNG in virtual time ([`LinkImpairment`]).
//!
//! Nothing here reads the clock or touches a socket. [`Fabric::step`] delivers the next
//! in-flight datagram or fires the next timer, jumping the virtual clock straight to it, so a
//! test of a 655 ms RNR back-off or a dozen retransmit timeouts runs in microseconds and the
//! same seed always gives the same run. Faults come from each node's own
//! [`FaultConfig`](crate::soft::FaultConfig), exactly as on the real UDP transport.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::ipoib::Endpoint;
use crate::mad::{self, Gsi, Mad};
use crate::soft::{SoftConfig, SoftVerbs};
use crate::verbs::conformance::ConformancePair;
use crate::verbs::Verbs;

/// Steps one [`ConformancePair::settle`] of a fabric takes at most.
pub const SETTLE_STEPS: usize = 50_000;
/// Virtual time one [`ConformancePair::settle`] of a fabric covers at most.
pub const SETTLE_TIME: Duration = Duration::from_millis(500);
/// Most datagrams one node may put on the wire in one [`Fabric::transmit`].
pub const MAX_BURST: usize = 1 << 16;
/// Most steps one [`Fabric::advance`] takes.
pub const MAX_ADVANCE_STEPS: usize = 1 << 20;

/// A datagram on the wire: `(arrival, sequence, destination node, source, bytes)`.
type InFlight = Reverse<(Instant, u64, usize, SocketAddr, IpAddr, Vec<u8>)>;

/// What a netem between two nodes does to each datagram one way, on top of the fabric's
/// latency. Every draw comes from an RNG seeded with `seed`, so a run repeats exactly.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinkImpairment {
    /// One-way delay.
    pub delay: Duration,
    /// Each datagram's delay is `delay` plus a uniform draw from `-jitter..=jitter` (never
    /// below zero). As in netem, datagrams are delivered in the order of their arrival
    /// times, so a jitter wider than their spacing reorders them.
    pub jitter: Duration,
    /// Percentage (0..=100) of datagrams sent at once, without the delay and the jitter
    /// (netem's `reorder`): they overtake everything sent in the last `delay`.
    pub reorder_pct: f64,
    /// Percentage (0..=100) of datagrams lost.
    pub loss_pct: f64,
    /// RNG seed.
    pub seed: u64,
}

/// One impaired link and its RNG.
#[derive(Debug)]
struct Link {
    imp: LinkImpairment,
    rng: ChaCha8Rng,
}

impl Link {
    /// The extra delay of the next datagram, or `None` when it is lost.
    fn draw(&mut self) -> Option<Duration> {
        let LinkImpairment {
            delay,
            jitter,
            reorder_pct,
            loss_pct,
            ..
        } = self.imp;
        if loss_pct > 0.0 && self.rng.gen::<f64>() * 100.0 < loss_pct {
            return None;
        }
        if reorder_pct > 0.0 && self.rng.gen::<f64>() * 100.0 < reorder_pct {
            return Some(Duration::ZERO);
        }
        if jitter.is_zero() {
            return Some(delay);
        }
        let j = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX / 2);
        let draw = self.rng.gen_range(0..=2 * j);
        Some(if draw >= j {
            delay + Duration::from_nanos(draw - j)
        } else {
            delay.saturating_sub(Duration::from_nanos(j - draw))
        })
    }
}

/// Several soft-RC nodes on one simulated wire.
#[derive(Debug)]
pub struct Fabric {
    /// The nodes, indexed from 0.
    pub nodes: Vec<SoftVerbs>,
    now: Instant,
    latency: Duration,
    wire: BinaryHeap<InFlight>,
    seq: u64,
    buf: Vec<u8>,
    /// Datagrams addressed to no node.
    pub undeliverable: u64,
    /// Datagrams delivered.
    pub delivered: u64,
    /// Drop everything sent by node `i` while `partitioned[i]` is true.
    pub partitioned: Vec<bool>,
    /// The IP MTU of node `i`'s underlay link (`None`: no limit): a datagram whose IPv4
    /// packet (the datagram and [`UDP_IPV4_HEADERS`]) exceeds the sender's or the receiver's
    /// is dropped, as a link drops it, and counted in [`too_big`](Self::too_big).
    pub link_mtu: Vec<Option<usize>>,
    /// Datagrams dropped for exceeding a link's MTU.
    pub too_big: u64,
    /// Impaired links by `(from, to)` node; the others only have the fabric's latency.
    links: BTreeMap<(usize, usize), Link>,
    /// Datagrams an impaired link lost.
    pub link_losses: u64,
}

/// Bytes of IPv4 and UDP header in front of a RoCEv2 datagram on the wire.
pub const UDP_IPV4_HEADERS: usize = 28;

impl Fabric {
    /// A fabric of nodes with the given configurations, one-way latency `latency`, and the
    /// virtual clock starting at `start`.
    pub fn new(configs: Vec<SoftConfig>, latency: Duration, start: Instant) -> Self {
        let n = configs.len();
        let mut nodes: Vec<SoftVerbs> = configs.into_iter().map(SoftVerbs::new).collect();
        // Each engine learns the virtual time before anything is asked of it.
        for node in &mut nodes {
            node.handle_timeout(start);
        }
        Self {
            nodes,
            now: start,
            latency,
            wire: BinaryHeap::new(),
            seq: 0,
            buf: Vec::new(),
            undeliverable: 0,
            delivered: 0,
            partitioned: vec![false; n],
            link_mtu: vec![None; n],
            too_big: 0,
            links: BTreeMap::new(),
            link_losses: 0,
        }
    }

    /// Impairs what node `from` sends to node `to` (replacing an earlier impairment of that
    /// link, its RNG started again from `imp.seed`).
    pub fn impair(&mut self, from: usize, to: usize, imp: LinkImpairment) {
        let rng = ChaCha8Rng::seed_from_u64(imp.seed);
        self.links.insert((from, to), Link { imp, rng });
    }

    /// `n` nodes on 198.18.0.1.. with default configurations adjusted by `adjust`, 5 µs
    /// apart, the virtual clock starting at `start` (any instant: only differences matter,
    /// and this module never reads the clock itself).
    pub fn with_nodes(
        n: usize,
        start: Instant,
        mut adjust: impl FnMut(usize, &mut SoftConfig),
    ) -> Self {
        let configs = (0..n)
            .map(|i| {
                let last = u8::try_from(i + 1).unwrap_or(u8::MAX);
                let mut c = SoftConfig::new(IpAddr::from([198, 18, 0, last]));
                adjust(i, &mut c);
                c
            })
            .collect();
        Self::new(configs, Duration::from_micros(5), start)
    }

    /// The virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    fn node_for(&self, ip: IpAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.config().local_ip == ip)
    }

    /// Moves everything the nodes want to send onto the wire.
    pub fn transmit(&mut self) {
        for i in 0..self.nodes.len() {
            let src = {
                let c = self.nodes[i].config();
                SocketAddr::new(c.local_ip, c.src_port)
            };
            for _ in 0..MAX_BURST {
                let Some(dst) = self.nodes[i].poll_transmit(self.now, &mut self.buf) else {
                    break;
                };
                if self.partitioned.get(i).copied().unwrap_or(false) {
                    continue;
                }
                // An IP multicast datagram reaches every other node (one L2 segment, whose
                // receivers keep what they joined); a unicast one the node of its address.
                let targets: Vec<usize> = if dst.ip().is_multicast() {
                    (0..self.nodes.len()).filter(|&j| j != i).collect()
                } else if let Some(j) = self.node_for(dst.ip()) {
                    vec![j]
                } else {
                    self.undeliverable += 1;
                    continue;
                };
                for j in targets {
                    self.put_on_wire(i, j, src, dst);
                }
            }
        }
    }

    /// Puts the datagram in `buf`, from node `i` at `src` to node `j` (sent to `dst`), on the
    /// wire, unless a link drops it.
    fn put_on_wire(&mut self, i: usize, j: usize, src: SocketAddr, dst: SocketAddr) {
        if self.exceeds_link(i, j, self.buf.len()) {
            self.too_big += 1;
            return;
        }
        let extra = match self.links.get_mut(&(i, j)) {
            None => Duration::ZERO,
            Some(link) => match link.draw() {
                Some(d) => d,
                None => {
                    self.link_losses += 1;
                    return;
                }
            },
        };
        self.seq += 1;
        let d = self.buf.clone();
        let at = self.now + self.latency + extra;
        self.wire.push(Reverse((at, self.seq, j, src, dst.ip(), d)));
    }

    /// Whether a datagram of `len` bytes from node `i` to node `j` exceeds either's link MTU.
    fn exceeds_link(&self, i: usize, j: usize, len: usize) -> bool {
        let mtu = |k: usize| {
            self.link_mtu
                .get(k)
                .copied()
                .flatten()
                .unwrap_or(usize::MAX)
        };
        len + UDP_IPV4_HEADERS > mtu(i).min(mtu(j))
    }

    /// The next instant anything happens: a delivery or a node's timer.
    pub fn next_event(&self) -> Option<Instant> {
        let wire = self.wire.peek().map(|Reverse((t, ..))| *t);
        let timers = self.nodes.iter().filter_map(SoftVerbs::poll_timeout).min();
        match (wire, timers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Transmits, then advances the clock to the next event and handles everything due then.
    /// Returns false when nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.transmit();
        let Some(t) = self.next_event() else {
            return false;
        };
        self.now = self.now.max(t);
        while let Some(Reverse((at, ..))) = self.wire.peek() {
            if *at > self.now {
                break;
            }
            let Some(Reverse((_, _, j, src, dst, d))) = self.wire.pop() else {
                break;
            };
            self.nodes[j].handle_datagram(self.now, src, dst, &d);
            self.delivered += 1;
        }
        for n in &mut self.nodes {
            n.handle_timeout(self.now);
        }
        self.transmit();
        true
    }

    /// Steps until `done` holds, nothing is left to happen, `max_steps` steps were taken, or
    /// the virtual clock passed `max_time` from now. Returns whether `done` held.
    pub fn run_until(
        &mut self,
        max_steps: usize,
        max_time: Duration,
        mut done: impl FnMut(&mut Self) -> bool,
    ) -> bool {
        let deadline = self.now + max_time;
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if self.now > deadline || !self.step() {
                return done(self);
            }
        }
        done(self)
    }

    /// Runs until nothing is left to happen (bounded by `max_steps` and `max_time`).
    pub fn run_idle(&mut self, max_steps: usize, max_time: Duration) {
        self.run_until(max_steps, max_time, |_| false);
    }

    /// Advances the virtual clock by `d`, handling every event due on the way (at most
    /// [`MAX_ADVANCE_STEPS`] steps).
    pub fn advance(&mut self, d: Duration) {
        let target = self.now + d;
        for _ in 0..MAX_ADVANCE_STEPS {
            match self.next_event() {
                Some(t) if t <= target => {
                    self.step();
                }
                _ => break,
            }
        }
        self.now = self.now.max(target);
        for n in &mut self.nodes {
            n.handle_timeout(self.now);
        }
        self.transmit();
    }
}

/// Nodes 0 and 1 of a fabric as a conformance pair; a settle runs the fabric until nothing is
/// left to happen, at most [`SETTLE_STEPS`] steps or [`SETTLE_TIME`] of virtual time.
///
/// # Panics
/// [`ConformancePair::providers`] panics on a fabric of fewer than two nodes.
impl ConformancePair<SoftVerbs> for Fabric {
    fn providers(&mut self) -> (&mut SoftVerbs, &mut SoftVerbs) {
        let (a, rest) = self.nodes.split_at_mut(1);
        (&mut a[0], &mut rest[0])
    }

    fn settle(&mut self) {
        self.run_idle(SETTLE_STEPS, SETTLE_TIME);
    }
}

pub mod cluster;

/// One endpoint's turn at `now` with its CM MADs on QP1 (`gsi`): the MADs received are
/// handed in, then the verbs completions and the timers are handled, each followed by
/// sending the MADs they queued while `gsi` has room. The TUN output is left for the caller
/// ([`Endpoint::poll_tun`]). `scratch` is reused between turns by [`mad::receive`].
pub fn endpoint_turn<V: Verbs>(
    ep: &mut Endpoint,
    gsi: &mut Gsi,
    v: &mut V,
    scratch: &mut Vec<Mad>,
    now: Instant,
) {
    mad::receive(gsi, v, scratch, |from, route, m| {
        ep.handle_routed_mad(now, from, route, m);
    });
    ep.handle_verbs(now, v);
    mad::send_while_room(gsi, v, || ep.poll_mad());
    ep.handle_timeout(now, v);
    mad::send_while_room(gsi, v, || ep.poll_mad());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Draws follow the configuration: losses and undelayed datagrams near their
    /// percentages, every delay within `delay ± jitter`, and the same seed gives the same draws.
    #[test]
    fn link_draws_follow_the_impairment_and_repeat() {
        let imp = LinkImpairment {
            delay: Duration::from_millis(20),
            jitter: Duration::from_millis(10),
            reorder_pct: 25.0,
            loss_pct: 5.0,
            seed: 9,
        };
        let draws = || {
            let mut l = Link {
                imp,
                rng: ChaCha8Rng::seed_from_u64(imp.seed),
            };
            (0..10_000).map(|_| l.draw()).collect::<Vec<_>>()
        };
        let d = draws();
        let lost = d.iter().filter(|x| x.is_none()).count();
        let at_once = d.iter().filter(|x| **x == Some(Duration::ZERO)).count();
        assert!((400..600).contains(&lost), "{lost}");
        assert!((2100..2700).contains(&at_once), "{at_once}");
        let delayed = d.iter().flatten().filter(|x| !x.is_zero());
        assert!(delayed.clone().all(|x| (10..=30).contains(&x.as_millis())));
        assert!(delayed.clone().any(|x| x.as_millis() < 12));
        assert!(delayed.clone().any(|x| x.as_millis() >= 28));
        assert_eq!(d, draws());
    }
}
