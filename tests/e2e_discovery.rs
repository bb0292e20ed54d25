//! End-to-end: nodes on one L2 segment find each other with no `--peer`, the broadcast group
//! crossing the underlay as IP multicast (UDP 4791 to 239.255.255.255, TTL 1).
//!
//! Four `ipoib-cm up` daemons in namespaces on one Linux bridge (in its own namespace; its
//! multicast snooping is left on: with no querier the bridge floods the groups, and the joins
//! send IGMP reports it learns from). Each pings every other over IPv4 (ARP through the
//! broadcast group) and IPv6 (ND through the solicited-node groups, which share the IPv4
//! group of the partition). A node with neither peers nor multicast warns at start and finds
//! no one. Without root the tests print `skipped: ...` and pass; every wait is bounded.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::netns::{output_within, wait_within, Lab};

const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");
const NODES: usize = 4;

/// The daemons of a test, stopped (SIGTERM, then SIGKILL) on drop; the lab's drop kills
/// anything left and deletes the namespaces.
struct Daemons {
    dir: PathBuf,
    children: Vec<(usize, Child)>,
}

impl Daemons {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ipoib-cm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("state dir");
        Self {
            dir,
            children: Vec::new(),
        }
    }

    fn socket(&self, k: usize) -> PathBuf {
        self.dir.join(format!("node{k}.sock"))
    }

    fn log_path(&self, k: usize) -> PathBuf {
        self.dir.join(format!("node{k}.log"))
    }

    fn log(&self, k: usize) -> String {
        std::fs::read_to_string(self.log_path(k)).unwrap_or_default()
    }

    /// Starts node `k`'s daemon (overlay 198.19.0.k/24 and 2001:db8:19::k/64, underlay
    /// 198.18.0.k, no `--peer`) with `extra` flags and waits until it answers `status`.
    fn start(&mut self, lab: &Lab, k: usize, extra: &[&str]) {
        self.start_on(lab, k, &lab.addr(k).to_string(), extra);
    }

    /// [`start`](Self::start) with underlay address `bind`.
    fn start_on(&mut self, lab: &Lab, k: usize, bind: &str, extra: &[&str]) {
        let log = File::create(self.log_path(k)).expect("log file");
        let v4 = format!("198.19.0.{k}/24");
        let v6 = format!("2001:db8:19::{k}/64");
        let sock = self.socket(k);
        let mut args = vec![
            BIN,
            "up",
            "--ifname",
            "ibd0",
            "--addr",
            &v4,
            "--addr",
            &v6,
            "--bind",
            bind,
            "--control-socket",
            sock.to_str().expect("utf-8 path"),
        ];
        args.extend_from_slice(extra);
        let child = lab
            .exec(k, &args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("spawn ipoib-cm up");
        self.children.push((k, child));
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            if status_json(&sock).is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("node {k} not ready after 20 s:\n{}", self.log(k));
    }

    fn status(&self, k: usize) -> serde_json::Value {
        status_json(&self.socket(k)).unwrap_or_else(|| panic!("status of node {k}"))
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        for (_, child) in &mut self.children {
            wait_within(child, Duration::from_secs(10));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn status_json(sock: &Path) -> Option<serde_json::Value> {
    let mut c = Command::new(BIN);
    c.args(["status", "--json", "--control-socket"]).arg(sock);
    let out = output_within(c, Duration::from_secs(5));
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn ping(lab: &Lab, from: usize, to: &str, extra: &[&str]) -> (bool, String) {
    let mut args = vec!["ping", "-n", "-c", "2", "-i", "0.2", "-W", "3"];
    args.extend_from_slice(extra);
    args.push(to);
    let out = output_within(lab.exec(from, &args), Duration::from_secs(20));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn provider_counter(s: &serde_json::Value, name: &str) -> u64 {
    s["provider"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no provider counter {name} in {s}"))
}

#[test]
fn four_nodes_find_each_other_without_peers() {
    let lab = match Lab::new("disc", NODES, 9000) {
        Ok(lab) => lab,
        Err(skip) => return skip.print(),
    };
    let mut d = Daemons::new("disc");
    for k in 1..=NODES {
        d.start(&lab, k, &[]);
    }
    for k in 1..=NODES {
        let log = d.log(k);
        assert!(
            !log.contains("neither --peer nor underlay multicast"),
            "node {k} warned although multicast is on:\n{log}"
        );
    }
    let t = Instant::now();
    for from in 1..=NODES {
        for to in (1..=NODES).filter(|&to| to != from) {
            let (ok, text) = ping(&lab, from, &format!("198.19.0.{to}"), &[]);
            assert!(
                ok,
                "ping 198.19.0.{to} from node {from}: {text}\n{}",
                d.log(from)
            );
        }
    }
    println!(
        "12 IPv4 pings, each first resolving by ARP: {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    for (from, to) in [(1, 2), (2, 3), (3, 4), (4, 1)] {
        let (ok, text) = ping(&lab, from, &format!("2001:db8:19::{to}"), &["-6"]);
        assert!(
            ok,
            "ping -6 node {to} from node {from}: {text}\n{}",
            d.log(from)
        );
    }
    println!(
        "4 IPv6 pings, each first resolving by ND: {:?}",
        t.elapsed()
    );
    for k in 1..=NODES {
        let s = d.status(k);
        assert_eq!(provider_counter(&s, "mcast_groups_joined"), 1, "{s}");
        assert!(provider_counter(&s, "mcast_rx_datagrams") >= 1, "{s}");
        assert_eq!(provider_counter(&s, "mcast_rx_own"), 0, "{s}");
        assert_eq!(provider_counter(&s, "mcast_join_errors"), 0, "{s}");
    }
}

/// On an IPv6 underlay each IPoIB group is the IPv6 multicast address of its MGID (link
/// scope), as rxe sends it: the broadcast group `ff12:401b:ffff::ffff:ffff` carries ARP, and
/// ND needs the all-nodes group `ff12:601b:ffff::1` and each address's solicited-node group
/// `ff12:601b:ffff::1:ffXX:XXXX`, which the endpoint attaches as Linux ipoib joins them.
#[test]
fn ipv6_underlay_finds_each_other_without_peers() {
    let lab = match Lab::new("discsix", 3, 9000) {
        Ok(lab) => lab,
        Err(skip) => return skip.print(),
    };
    for k in 1..=3 {
        let cidr = format!("2001:db8:18::{k}/64");
        let out = output_within(
            lab.exec(
                k,
                &["ip", "-6", "addr", "add", &cidr, "dev", "eth0", "nodad"],
            ),
            Duration::from_secs(10),
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut d = Daemons::new("discsix");
    for k in 1..=3 {
        d.start_on(&lab, k, &format!("2001:db8:18::{k}"), &[]);
    }
    for (from, to) in [(1, 2), (2, 3), (3, 1)] {
        let (ok, text) = ping(&lab, from, &format!("198.19.0.{to}"), &[]);
        assert!(
            ok,
            "ping 198.19.0.{to} from node {from}: {text}\n{}",
            d.log(from)
        );
    }
    let t = Instant::now();
    for (from, to) in [(1, 2), (2, 3), (3, 1)] {
        let (ok, text) = ping(&lab, from, &format!("2001:db8:19::{to}"), &["-6"]);
        assert!(
            ok,
            "ping -6 node {to} from node {from}: {text}\n{}",
            d.log(from)
        );
    }
    println!(
        "3 IPv6 pings over an IPv6 underlay, each first resolving by ND: {:?}",
        t.elapsed()
    );
    for k in 1..=3 {
        let s = d.status(k);
        // Broadcast, all-nodes and the solicited-node group of 2001:db8:19::k.
        assert_eq!(provider_counter(&s, "mcast_groups_joined"), 3, "{s}");
        assert!(provider_counter(&s, "mcast_rx_datagrams") >= 1, "{s}");
        assert_eq!(provider_counter(&s, "mcast_join_errors"), 0, "{s}");
    }
    let maddr = output_within(
        lab.exec(1, &["ip", "-6", "maddr", "show", "dev", "eth0"]),
        Duration::from_secs(10),
    );
    let maddr = String::from_utf8_lossy(&maddr.stdout);
    for group in [
        "ff12:401b:ffff::ffff:ffff",
        "ff12:601b:ffff::1",
        "ff12:601b:ffff::1:ff00:1",
    ] {
        assert!(
            maddr.split_whitespace().any(|w| w == group),
            "{group} not joined:\n{maddr}"
        );
    }
}

/// With `--peer` as well, the broadcast group reaches each peer both ways (multicast and a
/// unicast copy): delivered once, the second copy counted.
#[test]
fn peers_and_multicast_deliver_once() {
    let lab = match Lab::new("discdup", 2, 9000) {
        Ok(lab) => lab,
        Err(skip) => return skip.print(),
    };
    let mut d = Daemons::new("discdup");
    d.start(&lab, 1, &["--peer", "198.18.0.2"]);
    d.start(&lab, 2, &["--peer", "198.18.0.1"]);
    let (ok, text) = ping(&lab, 1, "198.19.0.2", &[]);
    assert!(ok, "ping: {text}\n{}", d.log(1));
    let s = d.status(2);
    assert!(
        provider_counter(&s, "rx_mcast_duplicates") >= 1,
        "node 2 got the ARP request once only? {s}"
    );
    let (ok, text) = ping(&lab, 2, "2001:db8:19::1", &["-6"]);
    assert!(ok, "ping -6: {text}\n{}", d.log(2));
}

/// Item 2 of the discovery work: a node with neither `--peer` nor multicast says so at start
/// (one line) and resolves no one.
#[test]
fn no_peers_and_no_multicast_warns_and_finds_no_one() {
    let lab = match Lab::new("discoff", 2, 9000) {
        Ok(lab) => lab,
        Err(skip) => return skip.print(),
    };
    let mut d = Daemons::new("discoff");
    d.start(&lab, 1, &["--no-multicast"]);
    d.start(&lab, 2, &["--no-multicast"]);
    let log = d.log(1);
    let warnings = log
        .lines()
        .filter(|l| l.contains("neither --peer nor underlay multicast"))
        .count();
    assert_eq!(warnings, 1, "{log}");
    let (ok, text) = ping(&lab, 1, "198.19.0.2", &["-c", "1"]);
    assert!(!ok, "resolved a neighbour with no way to reach it: {text}");
    let s = d.status(1);
    assert_eq!(provider_counter(&s, "mcast_groups_joined"), 0, "{s}");
}
