//! Connection set-up rate, stale-reap rate and heap per idle RX connection, measured on the
//! simulated fabric in one process (no sockets, no TUN).
//!
//! Run with `cargo bench --bench fabric_scale` (`scripts/bench.sh` does). Plain `fn main` (no
//! harness); without the `--bench` flag that `cargo bench` passes (as under `cargo test
//! --all-targets`) it returns at once.
//!
//! Topology: one hub endpoint (node 0, SRQ mode, `max_conn_qp` above the connection count)
//! and N small client endpoints, each with the hub as a static neighbour (so no ARP). Every
//! client gets one 64-byte UDP packet for the hub on its TUN side, which makes it open one
//! RC connection (CM REQ/REP/RTU over QP1) and send the packet on it. The driver below is a
//! minimal wire: a FIFO with a fixed 5 µs latency, a virtual clock that jumps to the next
//! event, and an address → node map (so delivery is O(1) even with 10,001 nodes).
//!
//! - **set-up rate**: from injecting the packets until the hub has accepted N RX connections
//!   and delivered N packets to its TUN side; N over the larger of the wall time and the
//!   virtual time. All N+1 endpoints and providers run on this one thread, so the wall time is
//!   the CPU cost of *both* ends of every handshake plus the simulator; the virtual time is
//!   what the handshakes take on the fabric (CM retransmission timeouts included). "burst"
//!   injects all N packets at once (N peers wanting the hub at the same moment); "paced"
//!   injects `PACED_BATCH` at a time, each batch run to completion.
//! - **heap per RX connection**: a counting global allocator attributes every allocation and
//!   free made while the hub's endpoint or provider runs to the hub; the hub's live heap after
//!   set-up minus before, divided by N. Fixed costs (the SRQ pool, CQs sized by
//!   `max_conn_qp`) are allocated at `Endpoint::new` and are not in the figure.
//! - **stale-reap rate**: every client is then killed (its endpoint dropped, nothing delivered
//!   to or sent from it, as after SIGKILL), the virtual clock jumps past `rx_timeout`, and only
//!   the hub runs until its RX connection count and its provider's QP count are back to the
//!   baseline. CPU time is this thread's utime+stime from `/proc/thread-self/stat` (10 ms
//!   resolution), wall time from `Instant`.
//! - **a cluster**: a hub with the daemon's defaults (`max_conn_qp`, `max_pending_rx`,
//!   `neigh_max`, `ud_depth` as `ipoib-cm up` runs) and `FABRIC_CLUSTER_N` clients that
//!   resolve it by ARP (their broadcast group reaches the hub alone, so the hub learns each
//!   of them) and send it one packet, `FABRIC_CLUSTER_BATCH` at a time; then the hub answers
//!   each, opening a TX connection to each. Figures: how many got through each way, the
//!   hub's QPs, neighbours and evictions, CPU and virtual time, and the hub's heap per peer.
//!
//! Settings (environment): `FABRIC_SETUP_N` (default 1000), `FABRIC_REAP_N` (default 10000),
//! `FABRIC_CLUSTER_N` (default 4000), `FABRIC_CLUSTER_BATCH` (default 64).
//! The last line printed is a JSON object with every figure.

// The counting allocator is the only unsafe code: a `GlobalAlloc` forwarding to `System`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use etherparse::PacketBuilder;
use ipoib_cm::ipoib::{Endpoint, EndpointConfig};
use ipoib_cm::mad::{Gsi, Mad, MadTransport};
use ipoib_cm::sim::{self, cluster::BASELINE_QPS};
use ipoib_cm::soft::{SoftConfig, SoftVerbs};
use ipoib_cm::verbs::{PathMtu, Verbs};

/// Counts live heap bytes allocated while [`HUB`] is set.
struct Counting;

static HUB: AtomicBool = AtomicBool::new(false);
static HUB_LIVE: AtomicI64 = AtomicI64::new(0);

fn account(delta: i64) {
    if HUB.load(Ordering::Relaxed) {
        HUB_LIVE.fetch_add(delta, Ordering::Relaxed);
    }
}

fn signed(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counters are only side effects.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        account(signed(layout.size()));
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        account(signed(layout.size()));
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        account(-signed(layout.size()));
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        account(signed(new_size) - signed(layout.size()));
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` with its allocations attributed to the hub.
fn as_hub<R>(f: impl FnOnce() -> R) -> R {
    HUB.store(true, Ordering::Relaxed);
    let r = f();
    HUB.store(false, Ordering::Relaxed);
    r
}

/// Clients that contact the hub together in the cluster run.
const CLUSTER_BATCH: usize = 64;
/// Clients that start connecting together in a paced set-up (a batch runs to completion
/// before the next starts).
const PACED_BATCH: usize = 32;
const LATENCY: Duration = Duration::from_micros(5);
const MAX_STEPS: usize = 2_000_000;

fn underlay(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, (i / 200) as u8, (i % 200 + 1) as u8)
}

fn overlay(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, (i / 200) as u8, (i % 200 + 1) as u8)
}

/// This thread's CPU time (utime + stime) in seconds, at USER_HZ (100 Hz) resolution.
fn thread_cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm field: state is index 0, utime is field 14 → index 11, stime index 12.
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

struct Sim {
    now: Instant,
    nodes: Vec<SoftVerbs>,
    eps: Vec<Option<Endpoint>>,
    /// Each node's CM MAD transport (QP1).
    mads: Vec<Gsi>,
    mad_scratch: Vec<Mad>,
    alive: Vec<bool>,
    by_ip: HashMap<IpAddr, usize>,
    wire: VecDeque<(Instant, usize, SocketAddr, Vec<u8>)>,
    scratch: Vec<u8>,
    tun_rx: Vec<u64>,
}

/// How the hub of a [`Sim`] is configured.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hub {
    /// Sized for the run (`max_conn_qp` and `max_pending_rx` above the client count, a spare
    /// receive buffer for each of the `burst` first packets that arrive together), and every
    /// client has the hub as a static neighbour: the handshake alone is measured.
    Sized { burst: usize },
    /// The daemon's defaults; clients resolve the hub by ARP (their broadcast group reaches
    /// the hub alone), so the hub learns every client as a neighbour, as in a cluster.
    Defaults,
}

impl Sim {
    /// A hub sized for `clients`, whose first packets arrive `burst` at a time.
    fn new(clients: usize, burst: usize) -> Self {
        Self::with_hub(clients, Hub::Sized { burst })
    }

    fn with_hub(clients: usize, hub_kind: Hub) -> Self {
        let now = Instant::now();
        let n = clients + 1;
        let mut nodes = Vec::with_capacity(n);
        let mut eps = Vec::with_capacity(n);
        let mut mads = Vec::with_capacity(n);
        let mut by_ip = HashMap::with_capacity(n);
        let mut hub_hw = None;
        for i in 0..n {
            let mut sc = SoftConfig::new(IpAddr::V4(underlay(i)));
            sc.port_mtu = PathMtu::Mtu4096;
            let mut c = EndpointConfig::new(vec![(IpAddr::V4(overlay(i)), 16)]);
            c.seed = i as u64 + 1;
            c.path_mtu = PathMtu::Mtu4096;
            // Long enough that no RX connection goes stale during set-up.
            c.rx_timeout = Duration::from_secs(600);
            c.drain_timeout = Duration::from_secs(1);
            if i == 0 && hub_kind == Hub::Defaults {
                // The daemon's defaults, but for the path MTU and the seed.
                c = EndpointConfig {
                    seed: c.seed,
                    path_mtu: c.path_mtu,
                    ..EndpointConfig::new(c.addrs)
                };
            } else if i == 0 {
                c.max_conn_qp = clients + 16;
                // Every client's REQ arrives at once (no fabric latency) and is half-open until
                // its RTU: with the default cap of 16 a REQ beyond it would tear down an older
                // half-open one, which then fails. The figure is the hub's set-up rate, so the
                // cap is the burst.
                c.max_pending_rx = clients;
                // A burst's first packets complete in one turn, before the TUN device takes
                // any: a spare buffer for each, or the hub drops those beyond `rx_spare`
                // (`rx_buffer_drops`, as it should under overload) and the set-up never ends.
                if let Hub::Sized { burst } = hub_kind {
                    c.rx_spare = c
                        .rx_spare
                        .max(u32::try_from(burst).expect("burst fits u32"));
                }
            } else {
                c.max_conn_qp = 2;
                c.srq_depth = 2;
                c.rx_spare = 2;
                c.tx_depth = 2;
                c.ud_depth = 2;
                if let (Hub::Sized { .. }, Some(hw)) = (hub_kind, hub_hw) {
                    c.static_neighbours = vec![(IpAddr::V4(overlay(0)), hw)];
                }
            }
            let mut v = SoftVerbs::new(sc);
            if hub_kind == Hub::Defaults && i > 0 {
                // The broadcast group (ARP) reaches the hub alone.
                v.set_mcast_peers(vec![IpAddr::V4(underlay(0))]);
            }
            let open = |v: &mut SoftVerbs| {
                let gsi = Gsi::open_for_cm(v)?;
                let qp1 = MadTransport::<SoftVerbs>::provider_qp(&gsi);
                Endpoint::new(now, v, c, qp1).map(|ep| (ep, gsi))
            };
            let (ep, gsi) = if i == 0 {
                as_hub(|| open(&mut v))
            } else {
                open(&mut v)
            }
            .expect("endpoint set-up");
            mads.push(gsi);
            if i == 0 {
                hub_hw = Some(ep.hwaddr());
            }
            by_ip.insert(IpAddr::V4(underlay(i)), i);
            nodes.push(v);
            eps.push(Some(ep));
        }
        Self {
            now,
            nodes,
            eps,
            mads,
            mad_scratch: Vec::new(),
            alive: vec![true; n],
            by_ip,
            wire: VecDeque::new(),
            scratch: Vec::with_capacity(16384),
            tun_rx: vec![0; n],
        }
    }

    fn service(&mut self, i: usize) {
        let now = self.now;
        let hub = i == 0;
        HUB.store(hub, Ordering::Relaxed);
        if let Some(ep) = self.eps[i].as_mut() {
            let v = &mut self.nodes[i];
            v.handle_timeout(now);
            let gsi = &mut self.mads[i];
            sim::endpoint_turn(ep, gsi, v, &mut self.mad_scratch, now);
            while let Some(p) = ep.poll_tun(v) {
                self.tun_rx[i] += 1;
                drop(p);
            }
        }
        loop {
            HUB.store(hub, Ordering::Relaxed);
            let dst = self.nodes[i].poll_transmit(now, &mut self.scratch);
            HUB.store(false, Ordering::Relaxed);
            let Some(dst) = dst else { break };
            let Some(&j) = self.by_ip.get(&dst.ip()) else {
                continue;
            };
            if self.alive[j] {
                let c = self.nodes[i].config();
                let src = SocketAddr::new(c.local_ip, c.src_port);
                self.wire
                    .push_back((now + LATENCY, j, src, self.scratch.clone()));
            }
        }
        HUB.store(false, Ordering::Relaxed);
    }

    fn next_event(&self, active: &[usize]) -> Option<Instant> {
        let mut next = self.wire.front().map(|w| w.0);
        for &i in active {
            for t in [
                self.nodes[i].poll_timeout(),
                self.eps[i].as_ref().and_then(Endpoint::poll_timeout),
            ]
            .into_iter()
            .flatten()
            {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        }
        next
    }

    /// Runs `active` nodes until `done`, nothing is left to happen, or the bounds.
    fn run(
        &mut self,
        active: &[usize],
        limit: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> bool {
        let end = self.now + limit;
        for _ in 0..MAX_STEPS {
            for &i in active {
                self.service(i);
            }
            if done(self) {
                return true;
            }
            let Some(next) = self.next_event(active) else {
                return done(self);
            };
            if self.now >= end {
                return false;
            }
            self.now = if next > self.now {
                next.min(end)
            } else if self.wire.front().is_some_and(|w| w.0 <= self.now) {
                self.now
            } else {
                self.now + Duration::from_micros(1)
            };
            while self.wire.front().is_some_and(|w| w.0 <= self.now) {
                let Some((_, j, src, d)) = self.wire.pop_front() else {
                    break;
                };
                if !self.alive[j] {
                    continue;
                }
                let dst = self.nodes[j].config().local_ip;
                HUB.store(j == 0, Ordering::Relaxed);
                self.nodes[j].handle_datagram(self.now, src, dst, &d);
                HUB.store(false, Ordering::Relaxed);
            }
        }
        done(self)
    }

    fn hub(&self) -> &Endpoint {
        self.eps[0].as_ref().expect("hub")
    }
}

struct Setup {
    qp1_drops: u64,
    virt_s: f64,
    failed: u64,
    req_retries: u64,
    wall_s: f64,
    cpu_s: f64,
    rx_conn_bytes: f64,
}

fn setup(sim: &mut Sim, n: usize, batch: usize) -> Setup {
    let active: Vec<usize> = (0..=n).collect();
    let mut packets = Vec::with_capacity(n);
    for i in 1..=n {
        let mut p = Vec::new();
        PacketBuilder::ipv4(overlay(i).octets(), overlay(0).octets(), 64)
            .udp(40000, 5201)
            .write(&mut p, &[0x5A; 36])
            .expect("packet");
        packets.push(p);
    }
    let heap0 = HUB_LIVE.load(Ordering::Relaxed);
    let cpu0 = thread_cpu_s();
    let t0 = Instant::now();
    let v0 = sim.now;
    // All at once (`batch` = n), or `batch` clients at a time, each batch run to completion.
    let mut ok = true;
    for (b, chunk) in packets.chunks(batch.max(1)).enumerate() {
        for (k, p) in chunk.iter().enumerate() {
            let i = b * batch.max(1) + k + 1;
            let now = sim.now;
            if let Some(ep) = sim.eps[i].as_mut() {
                ep.handle_tun_packet(now, &mut sim.nodes[i], p);
            }
        }
        let want = (b * batch.max(1) + chunk.len()) as u64;
        ok &= sim.run(&active, Duration::from_secs(300), |s| {
            s.hub().counters().rx_accepted >= want && s.tun_rx[0] >= want
        });
        if !ok {
            break;
        }
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu_s = thread_cpu_s() - cpu0;
    let virt_s = (sim.now - v0).as_secs_f64();
    let failed: u64 = sim
        .eps
        .iter()
        .flatten()
        .map(|e| e.counters().tx_failed)
        .sum();
    let req_retries: u64 = sim
        .eps
        .iter()
        .flatten()
        .skip(1)
        .map(|e| e.cm_stats().retransmits)
        .sum();
    assert!(
        ok,
        "set-up of {n} connections did not finish: hub accepted {}, TUN got {}, {virt_s:.1} s virtual, {failed} TX failed, {req_retries} CM retransmits, hub UD/QP1 drops {}",
        sim.hub().counters().rx_accepted,
        sim.tun_rx[0],
        sim.nodes[0].stats().rx_ud_dropped
    );
    let qp1_drops = sim.nodes[0].stats().rx_ud_dropped;
    // Let the handshakes' stragglers (ACKs, CM timers) settle for 10 ms of virtual time.
    sim.run(&active, Duration::from_millis(10), |_| false);
    let heap = HUB_LIVE.load(Ordering::Relaxed) - heap0;
    Setup {
        qp1_drops,
        virt_s,
        failed,
        req_retries,
        wall_s,
        cpu_s,
        rx_conn_bytes: heap as f64 / n as f64,
    }
}

struct Reap {
    wall_s: f64,
    cpu_s: f64,
    reaped: u64,
    virt_s: f64,
}

fn reap(sim: &mut Sim, n: usize) -> Reap {
    for i in 1..=n {
        sim.alive[i] = false;
        sim.eps[i] = None;
    }
    sim.wire.retain(|w| w.1 == 0);
    let cpu0 = thread_cpu_s();
    let t0 = Instant::now();
    let v0 = sim.now;
    sim.now += sim.hub().config().rx_timeout;
    let ok = sim.run(&[0], Duration::from_secs(120), |s| {
        s.hub().rx_count() == 0 && s.nodes[0].qp_count() == BASELINE_QPS
    });
    let wall_s = t0.elapsed().as_secs_f64();
    let cpu_s = thread_cpu_s() - cpu0;
    assert!(
        ok,
        "reap did not finish: {} RX connections, {} QPs left",
        sim.hub().rx_count(),
        sim.nodes[0].qp_count()
    );
    Reap {
        wall_s,
        cpu_s,
        reaped: sim.hub().counters().rx_stale_reaped,
        virt_s: (sim.now - v0).as_secs_f64(),
    }
}

/// What a node with the daemon's defaults does when `n` peers reach it at once and it
/// answers each.
struct Cluster {
    n: usize,
    /// Peers whose packet reached the hub's TUN, and peers the hub's answer reached.
    inbound: u64,
    outbound: u64,
    virt_s: f64,
    cpu_s: f64,
    hub_qps: usize,
    rx_conns: usize,
    tx_conns: usize,
    neighbours: usize,
    rx_evicted: u64,
    half_open_evicted: u64,
    neigh_evicted: u64,
    tx_failed: u64,
    cm_retransmits: u64,
    peer_bytes: f64,
}

/// `n` clients resolve the hub by ARP and send it one packet each, `batch` at a time (each
/// batch given up to 30 s of virtual time); then the hub answers each, in batches
/// as well (opening a TX connection to each). The hub runs with the daemon's defaults.
fn cluster(sim: &mut Sim, n: usize, batch: usize) -> Cluster {
    let active: Vec<usize> = (0..=n).collect();
    let udp = |from: usize, to: usize| {
        let mut p = Vec::new();
        PacketBuilder::ipv4(overlay(from).octets(), overlay(to).octets(), 64)
            .udp(40000, 5201)
            .write(&mut p, &[0x5A; 36])
            .expect("packet");
        p
    };
    let heap0 = HUB_LIVE.load(Ordering::Relaxed);
    let cpu0 = thread_cpu_s();
    let v0 = sim.now;
    let reached = |s: &Sim, upto: usize| s.tun_rx[1..=upto].iter().filter(|r| **r > 0).count();
    for start in (1..=n).step_by(batch) {
        let end = (start + batch - 1).min(n);
        for i in start..=end {
            let (now, p) = (sim.now, udp(i, 0));
            if let Some(ep) = sim.eps[i].as_mut() {
                ep.handle_tun_packet(now, &mut sim.nodes[i], &p);
            }
        }
        sim.run(&active, Duration::from_secs(30), |s| {
            s.tun_rx[0] >= end as u64
        });
    }
    let inbound = sim.tun_rx[0];
    for start in (1..=n).step_by(batch) {
        let end = (start + batch - 1).min(n);
        for i in start..=end {
            let (now, p) = (sim.now, udp(0, i));
            as_hub(|| {
                if let Some(ep) = sim.eps[0].as_mut() {
                    ep.handle_tun_packet(now, &mut sim.nodes[0], &p);
                }
            });
        }
        sim.run(&active, Duration::from_secs(30), |s| reached(s, end) >= end);
    }
    let outbound = reached(sim, n) as u64;
    let virt_s = (sim.now - v0).as_secs_f64();
    let cpu_s = thread_cpu_s() - cpu0;
    sim.run(&active, Duration::from_millis(10), |_| false);
    let heap = HUB_LIVE.load(Ordering::Relaxed) - heap0;
    let hub = sim.hub();
    let c = hub.counters();
    let nc = hub.snapshot(sim.now).neigh_counts;
    Cluster {
        n,
        inbound,
        outbound,
        virt_s,
        cpu_s,
        hub_qps: sim.nodes[0].qp_count(),
        rx_conns: hub.rx_count(),
        tx_conns: hub.tx_count(),
        neighbours: nc.incomplete + nc.reachable + nc.permanent,
        rx_evicted: c.rx_evicted,
        half_open_evicted: c.rx_half_open_evicted,
        neigh_evicted: c.neigh_evicted,
        tx_failed: sim
            .eps
            .iter()
            .flatten()
            .map(|e| e.counters().tx_failed)
            .sum(),
        cm_retransmits: sim
            .eps
            .iter()
            .flatten()
            .map(|e| e.cm_stats().retransmits)
            .sum(),
        peer_bytes: heap as f64 / n as f64,
    }
}

fn env_n(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| (1..=40_000).contains(n))
        .unwrap_or(default)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let setup_n = env_n("FABRIC_SETUP_N", 1000);
    let reap_n = env_n("FABRIC_REAP_N", 10_000);

    let t = Instant::now();
    let mut sim = Sim::new(setup_n, setup_n);
    println!(
        "{setup_n} clients + hub created in {:.3} s",
        t.elapsed().as_secs_f64()
    );
    let s = setup(&mut sim, setup_n, setup_n);
    report_setup("burst", setup_n, &s);
    drop(sim);

    let mut sim = Sim::new(setup_n, PACED_BATCH);
    let sp = setup(&mut sim, setup_n, PACED_BATCH);
    report_setup("paced", setup_n, &sp);
    drop(sim);

    let t = Instant::now();
    let mut sim = Sim::new(reap_n, PACED_BATCH);
    println!(
        "{reap_n} clients + hub created in {:.3} s",
        t.elapsed().as_secs_f64()
    );
    let s2 = setup(&mut sim, reap_n, PACED_BATCH);
    report_setup("paced", reap_n, &s2);
    let r = reap(&mut sim, reap_n);
    println!(
        "reap: {} stale RX QPs reaped in {:.3} s wall, {:.2} s CPU ({:.3} s virtual) = {:.0} QP/s",
        r.reaped,
        r.wall_s,
        r.cpu_s,
        r.virt_s,
        r.reaped as f64 / r.wall_s
    );
    let cluster_n = env_n("FABRIC_CLUSTER_N", 4000);
    let t = Instant::now();
    let mut sim = Sim::with_hub(cluster_n, Hub::Defaults);
    println!(
        "{cluster_n} clients + hub (daemon defaults) created in {:.3} s",
        t.elapsed().as_secs_f64()
    );
    let cluster_batch = env_n("FABRIC_CLUSTER_BATCH", CLUSTER_BATCH);
    let cl = cluster(&mut sim, cluster_n, cluster_batch);
    drop(sim);
    println!(
        "cluster: {} peers, {} at a time, to a node with the defaults: {}/{} reached it, it reached {}/{}, in {:.3} s virtual ({:.2} s CPU); hub QPs {}, RX {}, TX {}, neighbours {}; evicted: RX {}, half-open {}, neighbours {}; TX failed {}, CM retransmits {}; hub heap {:.0} B per peer",
        cl.n,
        cluster_batch,
        cl.inbound,
        cl.n,
        cl.outbound,
        cl.n,
        cl.virt_s,
        cl.cpu_s,
        cl.hub_qps,
        cl.rx_conns,
        cl.tx_conns,
        cl.neighbours,
        cl.rx_evicted,
        cl.half_open_evicted,
        cl.neigh_evicted,
        cl.tx_failed,
        cl.cm_retransmits,
        cl.peer_bytes
    );
    let json = serde_json::json!({
        "setup_conns": setup_n,
        "setup_wall_s": s.wall_s,
        "setup_cpu_s": s.cpu_s,
        "setup_virtual_s": s.virt_s,
        "setup_req_retransmits": s.req_retries,
        "setup_tx_failed": s.failed,
        "setup_qp1_drops": s.qp1_drops,
        "setup_paced_batch": PACED_BATCH,
        "setup_paced_wall_s": sp.wall_s,
        "setup_paced_virtual_s": sp.virt_s,
        "setup_paced_conns_per_s": setup_n as f64 / sp.wall_s.max(sp.virt_s),
        "setup_conns_per_s": setup_n as f64 / s.wall_s.max(s.virt_s),
        "rx_conn_bytes": s.rx_conn_bytes,
        "setup_big_conns": reap_n,
        "setup_big_paced_batch": PACED_BATCH,
        "setup_big_wall_s": s2.wall_s,
        "setup_big_virtual_s": s2.virt_s,
        "setup_big_req_retransmits": s2.req_retries,
        "rx_conn_bytes_big": s2.rx_conn_bytes,
        "reap_qps": r.reaped,
        "reap_wall_s": r.wall_s,
        "reap_cpu_s": r.cpu_s,
        "reap_qps_per_s": r.reaped as f64 / r.wall_s,
        "cluster_peers": cl.n,
        "cluster_batch": cluster_batch,
        "cluster_inbound": cl.inbound,
        "cluster_outbound": cl.outbound,
        "cluster_virtual_s": cl.virt_s,
        "cluster_cpu_s": cl.cpu_s,
        "cluster_hub_qps": cl.hub_qps,
        "cluster_rx_conns": cl.rx_conns,
        "cluster_tx_conns": cl.tx_conns,
        "cluster_neighbours": cl.neighbours,
        "cluster_rx_evicted": cl.rx_evicted,
        "cluster_half_open_evicted": cl.half_open_evicted,
        "cluster_neigh_evicted": cl.neigh_evicted,
        "cluster_tx_failed": cl.tx_failed,
        "cluster_cm_retransmits": cl.cm_retransmits,
        "cluster_peer_bytes": cl.peer_bytes,
    });
    println!("{json}");
}

/// The set-up rate is N over the larger of the wall time (CPU-bound simulation of both ends)
/// and the virtual time (what the handshakes take on a 5 µs fabric, CM retransmissions
/// included).
fn report_setup(how: &str, n: usize, s: &Setup) {
    println!(
        "set-up ({how}): {n} connections in {:.3} s wall ({:.2} s CPU), {:.3} s virtual, {} CM retransmits, {} TX failed, {} hub QP1/UD drops = {:.0} conn/s; hub heap {:.0} B per RX connection",
        s.wall_s,
        s.cpu_s,
        s.virt_s,
        s.req_retries,
        s.failed,
        s.qp1_drops,
        n as f64 / s.wall_s.max(s.virt_s),
        s.rx_conn_bytes
    );
}
