//! The daemon on InfiniBand ports of a simulated fabric, driven by a real subnet manager:
//! `scripts/ib-lab.sh` runs ibsim (MADs) and opensm in a namespace of their own, and each
//! node's `ipoib-cm up --link-layer infiniband` on its port (Hca<K>, odd nodes on switch 1,
//! even on switch 2) under ibsim's `umad2sim`: LID, SM, P_Keys and port events from the SM
//! through the port's SMA, the broadcast group and paths from the SA, the CM on the port's
//! QP1, packets with an LRH addressed by LID over the underlay.
//!
//! Each test runs ping, iperf3 and the SM's interventions with bounded waits, and prints the
//! recovery figures (`ping -D -O -i 0.05` across an event: seconds without replies, lost).
//! Needs root (skips, said, without), and Debian's ibsim-utils, opensm, infiniband-diags
//! (`scripts/ib-lab.sh` installs them).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::lab::Lab;

/// How long a fabric event may take to heal, at most, in these tests (the goal is 2 s after
/// the port is active again; a loaded CI machine gets room).
const HEAL: Duration = Duration::from_secs(20);

/// `ping -D -O -i 0.05 -W 1` from node `from` to `to` for at most `secs` seconds, running.
fn timed_ping(lab: &Lab, from: usize, to: &str, secs: u32) -> Child {
    Command::new("ip")
        .args(["netns", "exec", &format!("{}{from}", lab.prefix)])
        .args(["timeout", &(secs + 2).to_string(), "ping", "-n", "-D", "-O"])
        .args(["-i", "0.05", "-W", "1", "-w", &secs.to_string(), to])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ping")
}

/// What a [`timed_ping`] saw: its replies' times (seconds since the epoch) and how many
/// requests went unanswered.
struct PingRun {
    replies: Vec<f64>,
    lost: u32,
}

impl PingRun {
    fn of(child: Child) -> Self {
        let out = child.wait_with_output().expect("ping output");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut replies = Vec::new();
        let mut lost = 0;
        for l in text.lines() {
            if l.contains("no answer yet") {
                lost += 1;
            } else if l.contains("bytes from") {
                if let Some(t) = l
                    .strip_prefix('[')
                    .and_then(|r| r.split(']').next())
                    .and_then(|t| t.parse::<f64>().ok())
                {
                    replies.push(t);
                }
            }
        }
        Self { replies, lost }
    }

    /// The longest time between two replies.
    fn longest_gap(&self) -> f64 {
        self.replies
            .windows(2)
            .map(|w| w[1] - w[0])
            .fold(0.0f64, f64::max)
    }

    /// Seconds from `at` to the first reply after it (`None`: none came).
    fn first_reply_after(&self, at: f64) -> Option<f64> {
        self.replies.iter().find(|&&t| t > at).map(|t| t - at)
    }

    /// One line of figures for `what`, with the time from `at` (an instant the event was
    /// done, seconds since the epoch) to the first reply after it.
    fn report(&self, what: &str, at: f64) -> String {
        format!(
            "{what}: {} replies, {} lost, longest gap {:.2} s, first reply {} after",
            self.replies.len(),
            self.lost,
            self.longest_gap(),
            self.first_reply_after(at)
                .map_or("never".to_owned(), |d| format!("{d:.2} s"))
        )
    }
}

/// Now, in seconds since the epoch (what `ping -D` prints).
fn epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// `saquery ARGS` as the SM's own port, in the fabric's namespace.
fn saquery(lab: &Lab, args: &[&str]) -> String {
    let dir = lab.state.join("probe");
    let _ = std::fs::create_dir_all(&dir);
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &format!("{}fab", lab.prefix)])
        .args([
            "env",
            "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so",
        ])
        .args(["SIM_HOST=HcaSM", "IBSIM_SERVER_NAME=198.18.0.254"])
        .args(["timeout", "10", "saquery", "--smkey", "1"])
        .args(args)
        .current_dir(&dir);
    let out = common::lab::run_within(c, Duration::from_secs(15));
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn sh_ok(lab: &Lab, args: &[&str]) {
    let out = lab.sh(args);
    assert!(
        out.status.success(),
        "ib-lab.sh {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn provider(lab: &Lab, k: usize, name: &str) -> u64 {
    common::lab::provider_of(&lab.status(k), name)
}

#[test]
fn ip_crosses_an_infiniband_fabric_and_a_killed_peer_is_reaped() {
    crosses_the_fabric("ibfa", 1);
}

/// The same with two workers a node: each worker's provider sends and takes LID-addressed
/// packets by control's copy of the port and its routes, its connections open on the paths
/// control asked the SA for (one PathRecord query per destination for the interface), its
/// MADs on control's QP1; followers carry traffic of their own.
#[test]
fn ip_crosses_an_infiniband_fabric_on_two_workers() {
    crosses_the_fabric("ibfw", 2);
}

fn crosses_the_fabric(prefix: &str, workers: u8) {
    let workers_arg = workers.to_string();
    let Some(lab) = Lab::up_ib(
        prefix,
        2,
        &[
            "--rx-timeout",
            "2s",
            "--neigh-timeout",
            "3s",
            "--drain-timeout",
            "1s",
            "--workers",
            &workers_arg,
        ],
    ) else {
        return;
    };
    // The port as the SM made it: IB GIDs in the hardware addresses, LIDs from opensm.
    let s = lab.status(1);
    let hw = s["interface"]["hwaddr"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        hw.contains(":fe:80:00:00:00:00:00:00:"),
        "not an IB GID: {hw}"
    );
    let log = lab.log(1);
    assert!(
        log.contains("sa=ibsim0 port 1 lid"),
        "the SA client did not start: {log}"
    );
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    lab.ping_ok(1, "2001:db8:19::2", &[]);
    lab.ping_ok(1, "198.19.0.2", &["-s", "65000"]);
    // The broadcast and IPv6 groups were joined through the SA, and the path asked for.
    let groups = saquery(&lab, &["-g"]);
    assert!(groups.contains("ff12:401b:ffff::ffff:ffff"), "{groups}");
    assert!(
        lab.log(1).contains("Joined { mgid: Gid(ff12:601b:ffff::1)"),
        "no all-nodes group: {}",
        lab.log(1)
    );
    assert!(provider(&lab, 1, "sa_answered") >= 2);
    // A packet to a group nobody joined: a send-only join first, which the SA answers (the
    // MGID takes its scope from the broadcast group, as Linux ipoib maps it). `saquery -g`
    // through umad2sim shows the first RMPP segment only (three records), so the node's log
    // of the SA's answer is what is read.
    let _ = lab.exec(
        1,
        &[
            "ping",
            "-6",
            "-c",
            "2",
            "-i",
            "0.5",
            "-W",
            "1",
            "-I",
            "ib0",
            "ff0e::1:2",
        ],
        Duration::from_secs(10),
    );
    let joined = lab.wait_for(Duration::from_secs(10), |l| {
        l.log(1).contains("Joined { mgid: Gid(ff12:601b:ffff::1:2)")
    });
    assert!(joined, "no send-only join: {}", lab.log(1));
    // Eight streams: with two workers, the flows of both spread over both (each queue of
    // the TUN device is a worker's).
    if let Some(r) = lab.iperf3(1, 2, "198.19.0.2", &["-t", "3", "-P", "8"]) {
        let bps = r["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        println!(
            "iperf3 over the IB fabric, {workers} worker(s): {:.0} Mbit/s",
            bps / 1e6
        );
        assert!(bps > 0.0);
    }
    if workers > 1 {
        // The follower carried traffic of its own, on connections with paths from the SA.
        let s = lab.status(1);
        let w1 = &s["workers"][1];
        let carried =
            w1["tx_packets"].as_u64().unwrap_or(0) + w1["rx_packets"].as_u64().unwrap_or(0);
        assert!(carried > 0, "worker 1 carried nothing: {}", s["workers"]);
        let tx = s["tx"].as_array().cloned().unwrap_or_default();
        assert!(tx.len() >= 2, "a connection from each worker: {tx:?}");
        for t in &tx {
            assert!(t["path"]["dlid"].as_u64().unwrap_or(0) > 0, "no path: {t}");
        }
        // PathRecords are control's, one query per resolution of the destination, whatever
        // the workers (a follower has no SA client).
        let log = lab.log(1);
        let paths = log.matches("PathResolved { dgid").count();
        let resolved = log.matches("neighbour resolved peer=198.19.0.2").count();
        assert!(
            (1..=resolved).contains(&paths),
            "{paths} paths, {resolved} resolutions: {log}"
        );
        // The kernel steered by the QP behind the LRH: what reached the wrong worker (GRO
        // buffers) was handed over, none dropped.
        let (misrouted, datagrams) = (
            provider(&lab, 2, "rx_misrouted"),
            provider(&lab, 2, "rx_datagrams"),
        );
        println!("node 2: {misrouted} of {datagrams} datagrams reached another worker's socket");
        assert_eq!(provider(&lab, 2, "rx_foreign_dropped"), 0);
    }
    // Nothing was dropped as an IB port drops it.
    for k in [1, 2] {
        for c in ["rx_pkey_violations", "rx_wrong_dlid", "rx_bad_icrc"] {
            assert_eq!(provider(&lab, k, c), 0, "node {k} {c}");
        }
    }

    // A SIGKILLed peer's RX connections are reaped (one from each worker that sent).
    let rx = lab.status(1)["rx"].as_array().map_or(0, Vec::len);
    assert!(
        (1..=usize::from(workers)).contains(&rx),
        "{rx} RX connections"
    );
    sh_ok(&lab, &["kill", "2"]);
    let t0 = Instant::now();
    let reaped = lab.wait_for(Duration::from_secs(15), |l| {
        l.status(1)["rx"].as_array().is_some_and(Vec::is_empty)
    });
    assert!(reaped, "not reaped: {}", lab.status(1));
    println!(
        "RX connection reaped {:.1} s after SIGKILL (rx_timeout 2 s)",
        t0.elapsed().as_secs_f64()
    );
    sh_ok(&lab, &["start", "2"]);
    lab.ping_ok(2, "198.19.0.1", &[]);

    // Stopped, a daemon leaves its groups: the SA no longer lists its port.
    let gid2 = std::net::Ipv6Addr::from((0xfe80u128 << 112) | u128::from(port_guid(&lab, 2)));
    let member = |l: &Lab| {
        saquery(l, &["-m"])
            .lines()
            .any(|x| x.trim().starts_with("PortGid") && x.trim().ends_with(&format!(".{gid2}")))
    };
    assert!(
        member(&lab),
        "node 2 ({gid2}) no member: {}",
        saquery(&lab, &["-m"])
    );
    sh_ok(&lab, &["stop", "2"]);
    assert!(
        lab.wait_for(Duration::from_secs(10), |l| !member(l)),
        "node 2 still a member after its stop: {}",
        saquery(&lab, &["-m"])
    );
}

#[test]
fn what_the_sm_does_to_a_running_fabric() {
    let Some(lab) = Lab::up_ib("ibfb", 3, &[]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);

    // opensm stopped: node 1 and 2, which have their path, go on; between 1 and 3, which
    // never talked, the first unicast packet (3's ARP reply to 1's broadcast request) waits
    // for a path the SA never gives, and is dropped and counted.
    sh_ok(&lab, &["sm", "stop"]);
    lab.ping_ok(1, "198.19.0.2", &[]);
    let failed = |l: &Lab| {
        [1, 3]
            .iter()
            .map(|&k| provider(l, k, "path_failed_drops") + provider(l, k, "path_wait_drops"))
            .sum::<u64>()
    };
    let before = failed(&lab);
    let out = lab.ping(1, "198.19.0.3", &["-c", "1", "-W", "6"]);
    assert!(!out.status.success(), "a ping crossed without an SA");
    let dropped = lab.wait_for(Duration::from_secs(10), |l| failed(l) > before);
    assert!(dropped, "no path failure counted: {}", lab.status(3));

    // opensm started again forgets the groups: the port sees its membership gone and
    // re-registers (no signal), and the groups are back.
    let ping = timed_ping(&lab, 1, "198.19.0.2", 12);
    sh_ok(&lab, &["sm", "start"]);
    let started = epoch();
    let t0 = Instant::now();
    let back = lab.wait_for(HEAL, |l| {
        saquery(l, &["-g"]).contains("ff12:401b:ffff::ffff:ffff")
            && provider(l, 1, "sa_memberships_lost") >= 1
    });
    assert!(back, "no re-registration: {}", lab.log(1));
    println!(
        "opensm restart: groups back {:.1} s after",
        t0.elapsed().as_secs_f64()
    );
    println!("{}", PingRun::of(ping).report("opensm restart", started));
    lab.ping_ok(1, "198.19.0.3", &[]);

    // A link down and up: PORT_ERR on node 2, back after PORT_ACTIVE.
    let ping = timed_ping(&lab, 1, "198.19.0.2", 10);
    std::thread::sleep(Duration::from_secs(1));
    sh_ok(&lab, &["sim", "Unlink \"Hca2\""]);
    assert!(
        lab.wait_for(HEAL, |l| l.log(2).contains("PortDown")),
        "no PORT_ERR on node 2: {}",
        lab.log(2)
    );
    std::thread::sleep(Duration::from_secs(2));
    sh_ok(&lab, &["sim", "ReLink \"Hca2\""]);
    let relinked = epoch();
    assert!(
        lab.wait_for(HEAL, |l| l.log(2).contains("PortUp")),
        "no PORT_ACTIVE on node 2: {}",
        lab.log(2)
    );
    let run = PingRun::of(ping);
    println!("{}", run.report("link down 2 s, then up", relinked));
    assert!(
        run.first_reply_after(relinked).is_some(),
        "nothing after the link came back"
    );
    lab.ping_ok(1, "198.19.0.2", &[]);

    // SM failover: a standby on HcaSM2 takes over when the master is killed: SM_CHANGE.
    sh_ok(&lab, &["sm", "standby"]);
    let ping = timed_ping(&lab, 1, "198.19.0.2", 12);
    sh_ok(&lab, &["sm", "stop"]);
    let killed = epoch();
    assert!(
        lab.wait_for(HEAL, |l| l.log(1).contains("SmChange")),
        "no SM_CHANGE on node 1: {}",
        lab.log(1)
    );
    println!("{}", PingRun::of(ping).report("SM failover", killed));
    lab.ping_ok(1, "198.19.0.3", &[]);
    lab.ping_ok(3, "198.19.0.2", &[]);
}

/// The port GUID of node `k` (the low half of the GID in its hardware address).
fn port_guid(lab: &Lab, k: usize) -> u64 {
    let hw = lab.status(k)["interface"]["hwaddr"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let bytes: Vec<u8> = hw
        .split(':')
        .filter_map(|b| u8::from_str_radix(b, 16).ok())
        .collect();
    assert_eq!(bytes.len(), 20, "{hw}");
    bytes[12..]
        .iter()
        .fold(0u64, |g, b| (g << 8) | u64::from(*b))
}

#[test]
fn lids_reassigned_by_the_sm_are_followed() {
    lids_reassigned("ibfc", 1);
}

/// The same with two workers a node, each with connections of its own to the moved port:
/// node 2's follower sees `LID_CHANGE` through control's copy of the port, node 1's follows
/// control's new path, and no connection stays on the old LID.
#[test]
fn lids_reassigned_by_the_sm_are_followed_by_every_worker() {
    lids_reassigned("ibfx", 2);
}

/// Eight TCP streams node 1 -> node 2 for `secs` (with two workers, some on each).
fn streams(lab: &Lab, secs: &str) {
    let r = lab.iperf3(1, 2, "198.19.0.2", &["-t", secs, "-P", "8"]);
    if let Some(r) = r {
        let bps = r["end"]["sum_received"]["bits_per_second"]
            .as_f64()
            .unwrap_or(0.0);
        assert!(bps > 0.0, "{r}");
    }
}

fn lids_reassigned(prefix: &str, workers: u8) {
    let workers_arg = workers.to_string();
    let Some(lab) = Lab::up_ib(prefix, 2, &["--workers", &workers_arg]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    if workers > 1 {
        streams(&lab, "2");
    }
    let old = lab.status(2)["interface"]["port"]["lid"]
        .as_u64()
        .expect("lid");
    let guid = port_guid(&lab, 2);

    // opensm restarted with node 2 moved to LID 0x40 in its guid2lid.
    let ping = timed_ping(&lab, 1, "198.19.0.2", 14);
    std::thread::sleep(Duration::from_secs(1));
    sh_ok(&lab, &["sm", "stop"]);
    let g2l = lab.state.join("sm/guid2lid");
    let table = std::fs::read_to_string(&g2l).expect("guid2lid");
    // Line by line as opensm wrote it (its reader wants the blank lines between entries).
    let moved: String = table
        .lines()
        .map(|l| {
            let g = l
                .split_whitespace()
                .next()
                .and_then(|g| u64::from_str_radix(g.trim_start_matches("0x"), 16).ok());
            if g == Some(guid) {
                format!("{guid:#018x} 0x0040 0x0040\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    assert!(
        moved.contains("0x0040"),
        "node 2 ({guid:#x}) not in {table}"
    );
    std::fs::write(&g2l, moved).expect("guid2lid");
    let t0 = Instant::now();
    sh_ok(&lab, &["sm", "start"]);
    let started = epoch();
    assert!(
        lab.wait_for(HEAL, |l| l.log(2).contains("LidChange")),
        "no LID_CHANGE on node 2 (guid2lid now {:?}, SM log {}): {}",
        std::fs::read_to_string(&g2l),
        std::fs::read_to_string(lab.state.join("sm/out")).unwrap_or_default(),
        lab.log(2)
    );
    let moved_after = t0.elapsed();
    assert_eq!(lab.status(2)["interface"]["port"]["lid"], 0x40);
    // Node 1 asks for the path again and its connection goes to the new LID.
    let follows = lab.wait_for(HEAL, |l| {
        l.status(1)["tx"]
            .as_array()
            .is_some_and(|t| t.iter().any(|c| c["path"]["dlid"] == 0x40))
    });
    assert!(follows, "node 1 still on LID {old:#x}: {}", lab.status(1));
    // No connection of any worker stays on the old LID.
    let left = lab.wait_for(HEAL, |l| {
        l.status(1)["tx"]
            .as_array()
            .is_some_and(|t| t.iter().all(|c| c["path"]["dlid"] != old))
    });
    assert!(left, "a connection on LID {old:#x}: {}", lab.status(1));
    let what = format!(
        "LIDs reassigned ({old:#x} -> 0x40, LID_CHANGE {:.1} s after opensm started, {workers} worker(s))",
        moved_after.as_secs_f64()
    );
    println!("{}", PingRun::of(ping).report(&what, started));
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(2, "198.19.0.1", &[]);
    if workers > 1 {
        streams(&lab, "2");
        let s = lab.status(1);
        assert!(
            s["tx"]
                .as_array()
                .is_some_and(|t| t.len() >= 2 && t.iter().all(|c| c["path"]["dlid"] == 0x40)),
            "{}",
            s["tx"]
        );
    }
}

#[test]
fn joins_and_paths_complete_through_mad_loss_at_the_sa() {
    let Some(lab) = Lab::up_ib("ibfd", 2, &[]) else {
        return;
    };
    lab.ping_ok(1, "198.19.0.2", &[]);
    // 30 % of the MADs into the SM's port lost (ibsim drops a MAD as it enters a port: the
    // requests to the SA); node 2 starts again and must join and find its paths through
    // retries.
    sh_ok(&lab, &["sim", "Error \"HcaSM\"[1] 30"]);
    sh_ok(&lab, &["stop", "2"]);
    let t0 = Instant::now();
    sh_ok(&lab, &["start", "2"]);
    let up = lab.wait_for(Duration::from_secs(60), |l| {
        l.ping(2, "198.19.0.1", &["-c", "1", "-W", "2"])
            .status
            .success()
    });
    let reached = t0.elapsed();
    // Enough requests for a loss to be all but certain (0.7^30: membership checks go every
    // second).
    lab.wait_for(Duration::from_secs(60), |l| provider(l, 2, "sa_sent") >= 30);
    let s = lab.status(2);
    let retx = common::lab::provider_of(&s, "sa_retransmits");
    println!(
        "30 % MAD loss at the SA: node 2 joined and reached node 1 {:.1} s after its start, {} SA retransmissions, {} requests given up",
        reached.as_secs_f64(),
        retx,
        common::lab::provider_of(&s, "sa_timeouts")
    );
    assert!(up, "node 2 never reached node 1: {}", lab.log(2));
    assert!(retx >= 1, "no MAD was lost: {s}");
    sh_ok(&lab, &["sim", "Error \"HcaSM\"[1] 0"]);
    lab.ping_ok(1, "198.19.0.2", &[]);
}

#[test]
fn a_partition_admits_its_members_and_a_limited_one_reaches_full_ones_only() {
    let Some(lab) = Lab::up_ib("ibfe", 4, &[]) else {
        return;
    };
    // Partition 0x8002: nodes 1 and 2 full members, 3 and 4 limited ones.
    let guids: Vec<u64> = (1..=4).map(|k| port_guid(&lab, k)).collect();
    let conf = lab.state.join("partitions.conf");
    std::fs::write(
        &conf,
        format!(
            "Default=0x7fff, ipoib : ALL=full;\npart2=0x0002, ipoib : {:#018x}=full, {:#018x}=full, {:#018x}=limited, {:#018x}=limited;\n",
            guids[0], guids[1], guids[2], guids[3]
        ),
    )
    .expect("partitions.conf");
    let conf = conf.to_str().expect("utf-8").to_owned();
    sh_ok(&lab, &["sm", "restart", "-P", &conf]);
    assert!(
        lab.wait_for(HEAL, |l| l.log(3).contains("PkeyChange")),
        "no PKEY_CHANGE on node 3: {}",
        lab.log(3)
    );
    for (k, pkey) in [(1, "0x8002"), (2, "0x8002"), (3, "0x0002"), (4, "0x0002")] {
        sh_ok(&lab, &["stop", &k.to_string()]);
        sh_ok(&lab, &["start", &k.to_string(), "--", "--pkey", pkey]);
    }
    assert_eq!(lab.status(3)["interface"]["port"]["pkey"], 0x0002);
    // Full members reach each other, and a limited member reaches a full one.
    lab.ping_ok(1, "198.19.0.2", &[]);
    lab.ping_ok(3, "198.19.0.1", &[]);
    // Two limited members do not: node 3's broadcast ARP reaches node 4's port, which drops
    // it as a P_Key violation.
    let before = provider(&lab, 4, "rx_pkey_violations");
    let out = lab.ping(3, "198.19.0.4", &["-c", "2", "-W", "2"]);
    assert!(!out.status.success(), "two limited members talked");
    let violations = provider(&lab, 4, "rx_pkey_violations") - before;
    println!("limited to limited: {violations} P_Key violations dropped at node 4");
    assert!(violations >= 1, "{}", lab.status(4));
    assert_eq!(provider(&lab, 1, "rx_pkey_violations"), 0);
}

/// The UDP payloads of `pcap` (hex, one per line), beacons left out.
fn ib_payloads(pcap: &std::path::Path) -> Vec<Vec<u8>> {
    let mut c = Command::new("tshark");
    c.arg("-r")
        .arg(pcap)
        .args(["-T", "fields", "-e", "udp.payload"]);
    let out = common::lab::run_within(c, Duration::from_secs(30));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            (0..l.len())
                .step_by(2)
                .map(|i| l.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
                .collect::<Option<Vec<u8>>>()
        })
        .filter(|p| !p.is_empty() && !p.starts_with(b"IBsl"))
        .collect()
}

/// `packets` as a pcap of ERF records of type InfiniBand (LRH first), which Wireshark's
/// InfiniBand dissector reads.
fn erf_pcap(packets: &[Vec<u8>]) -> Vec<u8> {
    let mut f = 0xa1b2_c3d4u32.to_le_bytes().to_vec();
    f.extend_from_slice(&2u16.to_le_bytes());
    f.extend_from_slice(&4u16.to_le_bytes());
    for w in [0u32, 0, 65535, 197] {
        f.extend_from_slice(&w.to_le_bytes());
    }
    for p in packets {
        let len = u16::try_from(p.len()).expect("packet");
        let mut rec = vec![0u8; 8];
        rec.extend_from_slice(&[21, 0x04]);
        rec.extend_from_slice(&(len + 16).to_be_bytes());
        rec.extend_from_slice(&0u16.to_be_bytes());
        rec.extend_from_slice(&len.to_be_bytes());
        rec.extend_from_slice(p);
        let n = u32::try_from(rec.len()).expect("record");
        for w in [0u32, 0, n, n] {
            f.extend_from_slice(&w.to_le_bytes());
        }
        f.extend_from_slice(&rec);
    }
    f
}

#[test]
fn what_crosses_the_underlay_is_infiniband_as_wireshark_reads_it() {
    let Some(lab) = Lab::up_ib("ibff", 2, &[]) else {
        return;
    };
    let installed = Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI: no tshark"
        );
        println!("skipped: no tshark");
        return;
    }
    let pcap = lab.state.join("ib.pcap");
    let mut cap = Command::new("ip")
        .args(["netns", "exec", "ibff1", "tshark", "-q", "-i", "eth0"])
        .args(["-f", "udp port 4791", "-a", "duration:6", "-w"])
        .arg(&pcap)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tshark");
    std::thread::sleep(Duration::from_secs(2));
    lab.ping_ok(1, "198.19.0.2", &[]);
    common::netns::wait_within(&mut cap, Duration::from_secs(20));
    let packets = ib_payloads(&pcap);
    assert!(packets.len() >= 6, "captured {} packets", packets.len());
    // Every packet is a native IB packet whose VCRC and ICRC check.
    for p in &packets {
        ipoib_cm::wire::ib::parse_ib(p).unwrap_or_else(|e| panic!("{e}: {p:02x?}"));
    }
    // As Wireshark's InfiniBand dissector reads them.
    let erf = lab.state.join("ib-erf.pcap");
    std::fs::write(&erf, erf_pcap(&packets)).expect("erf");
    let mut c = Command::new("tshark");
    c.arg("-r")
        .arg(&erf)
        .args(["-T", "fields", "-E", "separator=,"]);
    for f in [
        "infiniband.lrh.lnh",
        "infiniband.lrh.dlid",
        "infiniband.lrh.slid",
        "infiniband.grh.nxthdr",
        "infiniband.bth.p_key",
        "infiniband.deth.q_key",
        "infiniband.cm.req.prim_locallid",
        "infiniband.cm.req.prim_remotelid",
        "infiniband.cm.req.prim_sl",
        "infiniband.cm.req.pppmtu",
    ] {
        c.args(["-e", f]);
    }
    let out = common::lab::run_within(c, Duration::from_secs(30));
    let rows: Vec<Vec<String>> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect();
    let lid = |k: usize| {
        lab.status(k)["interface"]["port"]["lid"]
            .as_u64()
            .expect("lid")
    };
    let (lid1, lid2) = (lid(1).to_string(), lid(2).to_string());
    let path = lab.status(1)["tx"][0]["path"].clone();
    let mlid = saquery(&lab, &["-g"])
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("Mlid")
                .map(|v| v.trim_start_matches('.').to_owned())
        })
        .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
        .expect("broadcast MLID");
    println!(
        "{} packets, LIDs {lid1}/{lid2}, broadcast MLID {mlid:#x}, path {path}",
        rows.len()
    );
    assert!(rows.iter().all(|r| r[4] == "65535"), "P_Keys: {rows:?}");
    // The broadcast ARP: a GRH (next header 0x1B), the group's MLID, Q_Key 0xB1B.
    assert!(
        rows.iter().any(|r| r[0] == "0x03"
            && r[1] == mlid.to_string()
            && r[2] == lid1
            && r[3] == "27"
            && r[5] == "0x0000000000000b1b"),
        "no broadcast to the MLID: {rows:?}"
    );
    // Unicast both ways: no GRH, by LID.
    assert!(rows
        .iter()
        .any(|r| r[0] == "0x02" && r[1] == lid2 && r[2] == lid1));
    assert!(rows
        .iter()
        .any(|r| r[0] == "0x02" && r[1] == lid1 && r[2] == lid2));
    // The REQ's primary path is the PathRecord's: its LIDs, SL and MTU (2048: enum 4).
    let req = rows
        .iter()
        .find(|r| r[6] == lid1)
        .unwrap_or_else(|| panic!("no REQ from node 1: {rows:?}"));
    assert_eq!(req[7], path["dlid"].to_string());
    assert_eq!(req[6], path["slid"].to_string());
    assert_eq!(
        u64::from_str_radix(req[8].trim_start_matches("0x"), 16).ok(),
        path["sl"].as_u64()
    );
    assert_eq!(req[9], "0x04", "path MTU 2048");
}
