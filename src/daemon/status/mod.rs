//! The daemon's status snapshot: the JSON document `ipoib-cm status --json` prints (and the
//! control socket carries), and its human-readable rendering.
//!
//! The key names are the schema; tests pin them against a literal list. New soft-provider
//! counters go into [`Status::provider`], a free-form map, so they can be shown without a
//! schema change.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::underlay::UnderlayCondition;
use crate::ipoib::{self, Mode};
pub use crate::ipoib::{RxState, TxState};
pub use prometheus::{render_prometheus, render_prometheus_all};
pub use totals::{
    DropReasons, Summary, Totals, RX_DROPPED, RX_ERRORS, SCHEMA, TX_DROPPED, TX_ERRORS,
};

mod prometheus;
mod totals;

/// The whole snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// Schema, version, uptime and the interface totals (top-level keys of the document).
    #[serde(flatten)]
    pub summary: Summary,
    /// The interface.
    pub interface: InterfaceStatus,
    /// Known neighbours (IP to IPoIB hardware address), at most
    /// [`SNAPSHOT_NEIGHBOURS`](ipoib::SNAPSHOT_NEIGHBOURS) of them, by address.
    pub neighbours: Vec<NeighbourStatus>,
    /// The whole neighbour table by state, and whether `neighbours` lists all of it.
    #[serde(default)]
    pub neighbour_table: NeighbourTable,
    /// Transmit (active side) connections.
    pub tx: Vec<TxStatus>,
    /// Receive (passive side) connections.
    pub rx: Vec<RxStatus>,
    /// Endpoint counters.
    pub counters: Counters,
    /// Soft-provider counters by name (free-form, may grow).
    #[serde(default)]
    pub provider: BTreeMap<String, u64>,
    /// The threads that carry the interface (`--workers`), by index: what each carried (the
    /// totals above are their sums). Empty in a status from a daemon before workers.
    #[serde(default)]
    pub workers: Vec<WorkerStatus>,
}

/// One worker: a thread with its TUN queue, provider, connections and reaper.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerStatus {
    /// Its index (0: the control side's, which also carries the interface's ARP, ND,
    /// multicast and datagrams).
    pub index: u8,
    /// IP packets it wrote to its TUN queue.
    pub rx_packets: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// IP packets it sent.
    pub tx_packets: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// Its RX connections now.
    pub rx_conns: u64,
    /// Its TX connections now.
    pub tx_conns: u64,
    /// CPU time its thread has used, in seconds.
    pub cpu_seconds: f64,
}

impl WorkerStatus {
    /// Worker `index`'s line from its own status (`part`, made as the interface's is) and its
    /// thread's CPU time.
    pub fn of(index: u8, part: &Status, cpu: std::time::Duration) -> Self {
        let t = &part.summary.totals;
        Self {
            index,
            rx_packets: t.rx_packets,
            rx_bytes: t.rx_bytes,
            tx_packets: t.tx_packets,
            tx_bytes: t.tx_bytes,
            rx_conns: part.rx.len() as u64,
            tx_conns: part.tx.len() as u64,
            cpu_seconds: cpu.as_secs_f64(),
        }
    }
}

/// The interface line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceStatus {
    /// Interface name.
    pub name: String,
    /// Interface MTU in bytes.
    pub mtu: u32,
    /// IPoIB mode.
    pub mode: Mode,
    /// Our IPoIB hardware address (as [`HwAddr`](crate::wire::ipoib::HwAddr) displays it).
    pub hwaddr: String,
    /// The CM transport (`--cm-transport`: `qp1`, `udp`, `rdmacm`); empty where not known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cm_transport: String,
    /// The path MTU in bytes (of UD sends, and of connections unless their PathRecord's is
    /// lower); 0 where not known.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub path_mtu: u32,
    /// Where the path MTU came from (`port active_mtu 4096`, `--bind link mtu 1500`,
    /// `--path-mtu 2048`); empty where not known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path_mtu_from: String,
    /// The underlay as the daemon last read it; absent where not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underlay: Option<UnderlayStatus>,
    /// The InfiniBand port, where the interface runs on one; absent on RoCE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortStatus>,
}

/// An InfiniBand port, as its SM left it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortStatus {
    /// `infiniband`.
    pub link_layer: String,
    /// The device (`mlx5_0`, `ibsim0`).
    pub device: String,
    /// The port number.
    pub port: u8,
    /// The port's LID.
    pub lid: u16,
    /// The SM's LID.
    pub sm_lid: u16,
    /// The partition (`--pkey`).
    pub pkey: u16,
}

/// A connection's path from the SA (an InfiniBand port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathStatus {
    /// The peer's LID.
    pub dlid: u16,
    /// Our LID on the path.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// The path's MTU in bytes.
    pub mtu: u32,
}

/// The underlay: the link that carries `--bind`, its condition and MTU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnderlayStatus {
    /// The link's name.
    pub link: String,
    /// `up`, `no-address` (`--bind` is gone), `no-carrier`, `down` or `gone`.
    pub state: UnderlayCondition,
    /// The link's MTU in bytes (0 while it is gone).
    pub mtu: u32,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference
const fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// State of a neighbour entry: the endpoint's [`ipoib::NeighState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NeighbourState {
    /// Resolution in progress; packets are queued.
    Incomplete,
    /// Resolved (aged out after the neighbour timeout unused).
    Reachable,
    /// Configured statically (`--neigh`): never resolved, never aged.
    Permanent,
}

impl NeighbourState {
    /// The name in JSON and text output.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Incomplete => "incomplete",
            Self::Reachable => "reachable",
            Self::Permanent => "permanent",
        }
    }
}

impl From<&ipoib::NeighState> for NeighbourState {
    fn from(s: &ipoib::NeighState) -> Self {
        match s {
            ipoib::NeighState::Incomplete { .. } => Self::Incomplete,
            ipoib::NeighState::Reachable => Self::Reachable,
            ipoib::NeighState::Static => Self::Permanent,
        }
    }
}

/// One neighbour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NeighbourStatus {
    /// The neighbour's IP address.
    pub ip: IpAddr,
    /// Its IPoIB hardware address (as [`HwAddr`](crate::wire::ipoib::HwAddr) displays it).
    pub hwaddr: String,
    /// Entry state.
    pub state: NeighbourState,
}

/// The neighbour table's summary: entries per state, however many `neighbours` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NeighbourTable {
    /// Every entry.
    pub total: u64,
    /// Entries being resolved.
    pub incomplete: u64,
    /// Resolved entries.
    pub reachable: u64,
    /// Static entries.
    pub permanent: u64,
    /// The cap on learned (incomplete and reachable) entries, `neigh_max`.
    pub max: u64,
    /// True when `neighbours` lists fewer than `total`.
    pub truncated: bool,
}

/// One transmit connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxStatus {
    /// The remote end: its GID or IP address.
    pub peer: String,
    /// Our QP number.
    pub qpn: u32,
    /// Connection state.
    pub state: TxState,
    /// Connected-mode MTU of this connection in bytes.
    pub mtu: u32,
    /// Packets queued waiting for the connection.
    pub queued: u64,
    /// Sends posted and not yet completed: the send buffers (shared by all TX connections)
    /// this connection holds.
    pub in_flight: u64,
    /// Its path from the SA (InfiniBand); absent on RoCE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathStatus>,
}

/// One receive connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RxStatus {
    /// The remote end: its GID or IP address.
    pub peer: String,
    /// Our QP number.
    pub qpn: u32,
    /// Connection state.
    pub state: RxState,
    /// Milliseconds since the last packet received on it.
    pub idle_ms: u64,
}

/// Endpoint counters, all monotonic except `qp_live`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    /// Connected-mode QPs that exist now (gauge).
    pub qp_live: u64,
    /// Connected-mode QPs created.
    pub qp_created: u64,
    /// Connected-mode QPs destroyed.
    pub qp_destroyed: u64,
    /// RX connections accepted.
    pub rx_accepted: u64,
    /// RX connections reaped for being idle past the RX timeout.
    pub rx_stale_reaped: u64,
    /// RX connections torn down on a DREQ.
    pub rx_dreq_reaped: u64,
    /// RX connections evicted to make room under the QP budget.
    pub rx_evicted: u64,
    /// QPs destroyed after the drain timeout instead of a proper drain.
    pub drain_timeouts: u64,
    /// Last WQE Reached events seen.
    pub last_wqe_events: u64,
    /// TX connections established.
    pub tx_established: u64,
    /// TX connections that failed (REJ, timeout, error, stall).
    pub tx_failed: u64,
    /// Of `tx_failed`: sends in flight and none completed for `tx_stall_timeout`.
    pub tx_stalled: u64,
    /// Packets dropped because a neighbour's queue was full.
    pub tx_queue_drops: u64,
    /// ICMP "packet too big" / "fragmentation needed" sent back to the host.
    pub icmp_too_big_sent: u64,
    /// Received packets dropped as malformed.
    pub rx_bad_packets: u64,
}

impl Counters {
    /// The counters from [`Counters::fields`]' list (names are ignored: the order is the
    /// schema's).
    fn from_fields(f: &[(&'static str, u64); 15]) -> Self {
        let v = |i: usize| f.get(i).map_or(0, |(_, v)| *v);
        Self {
            qp_live: v(0),
            qp_created: v(1),
            qp_destroyed: v(2),
            rx_accepted: v(3),
            rx_stale_reaped: v(4),
            rx_dreq_reaped: v(5),
            rx_evicted: v(6),
            drain_timeouts: v(7),
            last_wqe_events: v(8),
            tx_established: v(9),
            tx_failed: v(10),
            tx_stalled: v(11),
            tx_queue_drops: v(12),
            icmp_too_big_sent: v(13),
            rx_bad_packets: v(14),
        }
    }

    /// `(name, value)` in schema order, for rendering.
    pub fn fields(&self) -> [(&'static str, u64); 15] {
        [
            ("qp_live", self.qp_live),
            ("qp_created", self.qp_created),
            ("qp_destroyed", self.qp_destroyed),
            ("rx_accepted", self.rx_accepted),
            ("rx_stale_reaped", self.rx_stale_reaped),
            ("rx_dreq_reaped", self.rx_dreq_reaped),
            ("rx_evicted", self.rx_evicted),
            ("drain_timeouts", self.drain_timeouts),
            ("last_wqe_events", self.last_wqe_events),
            ("tx_established", self.tx_established),
            ("tx_failed", self.tx_failed),
            ("tx_stalled", self.tx_stalled),
            ("tx_queue_drops", self.tx_queue_drops),
            ("icmp_too_big_sent", self.icmp_too_big_sent),
            ("rx_bad_packets", self.rx_bad_packets),
        ]
    }
}

impl Status {
    /// The status of interface `name` from the endpoint's snapshot: its tables and counters,
    /// `qp_live` counted by the endpoint; [`Status::provider`] holds the endpoint's counters
    /// that [`Counters`] has not, for the driver to add its own to.
    pub fn from_snapshot(name: &str, snap: &ipoib::Snapshot) -> Self {
        let c = &snap.counters;
        let schema = Counters::default().fields().map(|(name, _)| name);
        let mut provider = BTreeMap::new();
        add_counters(&mut provider, "", c);
        provider.retain(|k, _| !schema.contains(&k.as_str()));
        let counts = &snap.neigh_counts;
        let total = counts.incomplete + counts.reachable + counts.permanent;
        let neighbour_table = NeighbourTable {
            total: total as u64,
            incomplete: counts.incomplete as u64,
            reachable: counts.reachable as u64,
            permanent: counts.permanent as u64,
            max: snap.neigh_max as u64,
            truncated: snap.neighbours.len() < total,
        };
        Self {
            summary: Summary::default(),
            interface: InterfaceStatus {
                name: name.to_owned(),
                mtu: snap.mtu,
                mode: snap.mode,
                hwaddr: snap.hwaddr.to_string(),
                cm_transport: String::new(),
                path_mtu: 0,
                path_mtu_from: String::new(),
                underlay: None,
                port: None,
            },
            neighbours: snap
                .neighbours
                .iter()
                .map(|(ip, hw, st)| NeighbourStatus {
                    ip: *ip,
                    hwaddr: hw.map(|h| h.to_string()).unwrap_or_default(),
                    state: st.into(),
                })
                .collect(),
            neighbour_table,
            tx: snap
                .tx
                .iter()
                .map(|t| TxStatus {
                    peer: t.peer.gid.to_string(),
                    qpn: t.qpn.get(),
                    state: t.state,
                    mtu: t.mtu,
                    queued: t.queued as u64,
                    in_flight: u64::from(t.in_flight),
                    path: t.path.map(|p| PathStatus {
                        dlid: p.dlid.0,
                        slid: p.slid.0,
                        sl: p.sl.get(),
                        mtu: p.mtu.bytes() as u32,
                    }),
                })
                .collect(),
            rx: snap
                .rx
                .iter()
                .map(|(peer, qpn, st, idle)| RxStatus {
                    peer: peer.to_string(),
                    qpn: qpn.get(),
                    state: *st,
                    idle_ms: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
                })
                .collect(),
            counters: Counters::from(c),
            provider,
            workers: Vec::new(),
        }
    }

    /// Adds another worker's status (made as this one, from its endpoint and provider) to
    /// this one: its connections to the lists, its counters to the counters. The summary is
    /// the caller's to make again.
    pub fn absorb(&mut self, other: &Self) {
        self.tx.extend(other.tx.iter().cloned());
        self.rx.extend(other.rx.iter().cloned());
        let mut sum = self.counters.fields();
        for ((_, v), (_, o)) in sum.iter_mut().zip(other.counters.fields()) {
            *v += o;
        }
        self.counters = Counters::from_fields(&sum);
        for (k, v) in &other.provider {
            *self.provider.entry(k.clone()).or_default() += v;
        }
    }
}

/// Adds the counters of `stats` to `out`, each named `prefix` and the name its serde derive
/// gives it; fields that are not unsigned integers (nested structs) are left out.
pub fn add_counters(out: &mut BTreeMap<String, u64>, prefix: &str, stats: &impl Serialize) {
    if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(stats) {
        for (name, v) in fields {
            if let Some(n) = v.as_u64() {
                out.insert(format!("{prefix}{name}"), n);
            }
        }
    }
}

impl From<&ipoib::Counters> for Counters {
    /// The endpoint's counters of the schema; `qp_live` is what the endpoint created and did
    /// not destroy (a provider that counts its QPs overrides it).
    fn from(c: &ipoib::Counters) -> Self {
        Self {
            qp_live: c.qp_created.saturating_sub(c.qp_destroyed),
            qp_created: c.qp_created,
            qp_destroyed: c.qp_destroyed,
            rx_accepted: c.rx_accepted,
            rx_stale_reaped: c.rx_stale_reaped,
            rx_dreq_reaped: c.rx_dreq_reaped,
            rx_evicted: c.rx_evicted,
            drain_timeouts: c.drain_timeouts,
            last_wqe_events: c.last_wqe_events,
            tx_established: c.tx_established,
            tx_failed: c.tx_failed,
            tx_stalled: c.tx_stalled,
            tx_queue_drops: c.tx_queue_drops,
            icmp_too_big_sent: c.icmp_too_big_sent,
            rx_bad_packets: c.rx_bad_packets,
        }
    }
}

/// The JSON document, pretty-printed with a trailing newline (`ipoib-cm status --json`).
pub fn render_json(status: &Status) -> String {
    // Serializing these plain structs cannot fail (string keys, no non-finite floats).
    let mut s = serde_json::to_string_pretty(status).unwrap_or_else(|e| {
        serde_json::json!({ "error": format!("cannot serialize status: {e}") }).to_string()
    });
    s.push('\n');
    s
}

/// A left-aligned text table with a two-space indent and two-space column gaps.
fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::from(" ");
        for (cell, w) in cells.zip(&width) {
            let _ = write!(l, " {cell:<w$} ");
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

/// Which counters the human-readable status shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shown {
    /// Those that are not zero, grouped (`ipoib-cm status`).
    NonZero,
    /// Every one, endpoint and provider counters apart (`ipoib-cm status --all`).
    All,
}

/// What an operator reads a counter as: the group it is listed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    Connections,
    Reaping,
    Cm,
    Drops,
    Other,
}

impl Group {
    const ALL: [Self; 5] = [
        Self::Connections,
        Self::Reaping,
        Self::Cm,
        Self::Drops,
        Self::Other,
    ];

    const fn label(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::Reaping => "reaping",
            Self::Cm => "cm",
            Self::Drops => "drops",
            Self::Other => "other",
        }
    }

    /// The group of the counter `name` (endpoint or provider), by the words in it.
    fn of(name: &str) -> Self {
        let has = |words: &[&str]| words.iter().any(|w| name.contains(w));
        if has(&[
            "reap", "drain", "last_wqe", "evict", "stale", "flush", "watchdog",
        ]) {
            Self::Reaping
        } else if has(&[
            "drop", "bad", "fail", "err", "reject", "invalid", "full", "lost",
        ]) {
            Self::Drops
        } else if name.starts_with("cm_")
            || has(&["req", "rep_", "_rep", "mra", "rtu", "rej", "sidr", "mad"])
        {
            Self::Cm
        } else if name.starts_with("qp_") || name.starts_with("tx_") || name.starts_with("rx_") {
            Self::Connections
        } else {
            Self::Other
        }
    }
}

/// Appends `  LABEL: a 1, b 2, ...` wrapped before [`TEXT_WIDTH`] columns.
fn counter_line<'a>(out: &mut String, label: &str, items: impl Iterator<Item = (&'a str, u64)>) {
    let head = format!("  {label}: ");
    let indent = " ".repeat(head.len());
    let mut line = head.clone();
    for (i, (name, v)) in items.enumerate() {
        let item = format!("{name} {v}");
        if i > 0 {
            if line.len() + 2 + item.len() > TEXT_WIDTH {
                line.push(',');
                out.push_str(&line);
                out.push('\n');
                line.clone_from(&indent);
            } else {
                line.push_str(", ");
            }
        }
        line.push_str(&item);
    }
    out.push_str(&line);
    out.push('\n');
}

/// Where the grouped counter lines wrap.
const TEXT_WIDTH: usize = 100;

/// The human-readable status (`ipoib-cm status` without `--json`): the interface line, its
/// totals and what the drops were, then the neighbour, TX and RX tables, then the counters:
/// with [`Shown::NonZero`] those that are not zero, grouped (connections, reaping, CM, drops,
/// other), with [`Shown::All`] every endpoint and provider counter.
pub fn render_text(status: &Status, shown: Shown) -> String {
    let mut out = String::new();
    let i = &status.interface;
    let _ = writeln!(
        out,
        "{}: mtu {} mode {} hwaddr {}",
        i.name, i.mtu, i.mode, i.hwaddr
    );
    if !i.cm_transport.is_empty() {
        out.pop();
        let _ = writeln!(out, " cm {}", i.cm_transport);
    }
    if i.path_mtu != 0 {
        out.pop();
        let _ = writeln!(out, " path_mtu {} ({})", i.path_mtu, i.path_mtu_from);
    }
    if let Some(u) = &i.underlay {
        out.pop();
        let _ = writeln!(
            out,
            " underlay {} {} mtu {}",
            u.link,
            u.state.as_str(),
            u.mtu
        );
    }
    if let Some(p) = &i.port {
        let _ = writeln!(
            out,
            "  port {} {} {} lid {:#x} sm_lid {:#x} pkey {:#06x}",
            p.device, p.port, p.link_layer, p.lid, p.sm_lid, p.pkey
        );
    }
    let m = &status.summary;
    let t = &m.totals;
    let _ = writeln!(out, "  version {} uptime {}s", m.version, m.uptime_s);
    let _ = writeln!(
        out,
        "  RX: packets {} bytes {} dropped {} errors {}",
        t.rx_packets, t.rx_bytes, t.rx_dropped, t.rx_errors
    );
    let _ = writeln!(
        out,
        "  TX: packets {} bytes {} dropped {} errors {}",
        t.tx_packets, t.tx_bytes, t.tx_dropped, t.tx_errors
    );
    if status.workers.len() > 1 {
        for w in &status.workers {
            let _ = writeln!(
                out,
                "  worker {}: rx {} packets {} bytes, tx {} packets {} bytes, rx_conns {}, tx_conns {}, cpu {:.2}s",
                w.index, w.rx_packets, w.rx_bytes, w.tx_packets, w.tx_bytes, w.rx_conns,
                w.tx_conns, w.cpu_seconds
            );
        }
    }
    for (dir, reasons) in [("RX", &m.drops.rx), ("TX", &m.drops.tx)] {
        let mut why = reasons.iter().filter(|(_, &v)| v != 0).peekable();
        if why.peek().is_some() {
            counter_line(
                &mut out,
                &format!("{dir} dropped"),
                why.map(|(n, &v)| (n.as_str(), v)),
            );
        }
    }

    let _ = write!(out, "\nneighbours ({}", status.neighbours.len());
    if status.neighbour_table.truncated {
        let _ = write!(out, " of {}", status.neighbour_table.total);
    }
    out.push(')');
    if status.neighbours.is_empty() {
        out.push_str(": none\n");
    } else {
        out.push_str(":\n");
        let rows: Vec<_> = status
            .neighbours
            .iter()
            .map(|n| {
                vec![
                    n.ip.to_string(),
                    n.hwaddr.clone(),
                    n.state.as_str().to_owned(),
                ]
            })
            .collect();
        table(&mut out, &["IP", "HWADDR", "STATE"], &rows);
    }

    let _ = write!(out, "\ntx ({})", status.tx.len());
    if status.tx.is_empty() {
        out.push_str(": none\n");
    } else {
        out.push_str(":\n");
        // The PATH column only where the SA gives paths (an InfiniBand port).
        let paths = status.tx.iter().any(|t| t.path.is_some());
        let rows: Vec<_> = status
            .tx
            .iter()
            .map(|t| {
                let mut row = vec![
                    t.peer.clone(),
                    format!("{:#08x}", t.qpn),
                    t.state.as_str().to_owned(),
                    t.mtu.to_string(),
                    t.queued.to_string(),
                    t.in_flight.to_string(),
                ];
                if paths {
                    row.push(t.path.map_or("-".to_owned(), |p| {
                        format!("lid {:#x} sl {} mtu {}", p.dlid, p.sl, p.mtu)
                    }));
                }
                row
            })
            .collect();
        let mut head = vec!["PEER", "QPN", "STATE", "MTU", "QUEUED", "IN_FLIGHT"];
        if paths {
            head.push("PATH");
        }
        table(&mut out, &head, &rows);
    }

    let _ = write!(out, "\nrx ({})", status.rx.len());
    if status.rx.is_empty() {
        out.push_str(": none\n");
    } else {
        out.push_str(":\n");
        let rows: Vec<_> = status
            .rx
            .iter()
            .map(|r| {
                vec![
                    r.peer.clone(),
                    format!("{:#08x}", r.qpn),
                    r.state.as_str().to_owned(),
                    format!("{}ms", r.idle_ms),
                ]
            })
            .collect();
        table(&mut out, &["PEER", "QPN", "STATE", "IDLE"], &rows);
    }

    match shown {
        Shown::All => all_counters(&mut out, status),
        Shown::NonZero => grouped_counters(&mut out, status),
    }
    out
}

/// Every endpoint counter, then every provider counter, one a line.
fn all_counters(out: &mut String, status: &Status) {
    out.push_str("\ncounters:\n");
    let fields = status.counters.fields();
    let w = fields.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, v) in fields {
        let _ = writeln!(out, "  {name:<w$}  {v}");
    }
    if !status.provider.is_empty() {
        out.push_str("\nprovider:\n");
        let w = status.provider.keys().map(String::len).max().unwrap_or(0);
        for (name, v) in &status.provider {
            let _ = writeln!(out, "  {name:<w$}  {v}");
        }
    }
}

/// The counters that are not zero (endpoint's, then provider's), a line per group.
fn grouped_counters(out: &mut String, status: &Status) {
    let fields = status.counters.fields();
    let nonzero: Vec<(&str, u64)> = fields
        .iter()
        .map(|&(n, v)| (n, v))
        .chain(status.provider.iter().map(|(n, &v)| (n.as_str(), v)))
        .filter(|&(_, v)| v != 0)
        .collect();
    out.push_str("\ncounters (not zero; --all for every one):");
    if nonzero.is_empty() {
        out.push_str(" none\n");
        return;
    }
    out.push('\n');
    for group in Group::ALL {
        let mut items = nonzero
            .iter()
            .filter(|(n, _)| Group::of(n) == group)
            .peekable();
        if items.peek().is_some() {
            counter_line(out, group.label(), items.copied());
        }
    }
}

#[cfg(test)]
mod tests;
