//! End-to-end: `ipoib-cm up` run as a service, in network namespaces this file creates (the
//! `esvc` labs of `tests/common/netns.rs`) and deletes, also on failure.
//!
//! - SIGHUP reloads `--config`: a static neighbour added in the file becomes reachable with
//!   no restart, an established connection survives the reload (the same TX QP), a setting
//!   that cannot change live is named, and an invalid file keeps the running configuration;
//! - the control commands `neigh add|show|del`, `peer add|del`, `down`, with their one-line
//!   errors and exit codes;
//! - `ip link del ib0` ends the daemon with one line and the orderly teardown (exit 0);
//! - the default control socket is per network namespace, `status` without a name finds
//!   every daemon of the namespace, and `status IFNAME --control-socket X` refuses another
//!   interface;
//! - the systemd notification protocol against a fake `NOTIFY_SOCKET`;
//! - a reload never stalls the loop: the config path a symlink to a FIFO, then to
//!   `/dev/zero` (refused at once, one line each), and a 4,096-neighbour file under a storm of
//!   200 SIGHUPs a second for 4 s, while node 1 pings node 2 every 10 ms: no ping lost,
//!   `status` and SIGTERM answered;
//! - no one locks root out of the (abstract, default) control socket: 200 idle connections of
//!   an unprivileged user reconnecting every 0.9 s, then 200 idle connections of root, while
//!   root's `status`, `reload` and `down` are answered every time within
//!   [`CONTROL_ANSWER`] (the figures print with `--nocapture`).
//!
//! Without root every test prints `skipped: ...` and passes. Every wait is bounded.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use common::netns::{output_within, wait_within, Lab, Lines};

const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");
/// How long a daemon may take to come up.
const START: Duration = Duration::from_secs(20);
/// How long a command may take.
const CMD: Duration = Duration::from_secs(10);

/// A daemon in a lab node, its stderr read line by line; killed on drop if still running.
struct Daemon {
    child: Child,
    log: Lines,
}

impl Daemon {
    /// Starts `ipoib-cm up ARGS` in node `k` with `env` and waits for its start-up line.
    fn start(lab: &Lab, k: usize, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = lab.exec(k, &[BIN, "up"]);
        // Neighbours here come only from --peer, --neigh and the control socket, not from
        // multicast discovery on the lab's bridge.
        cmd.arg("--no-multicast")
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn daemon");
        let log = Lines::new(child.stderr.take().expect("stderr"));
        let mut d = Self { child, log };
        assert!(
            d.log.wait_for(" started version=", START),
            "node {k} did not come up: {}",
            d.text()
        );
        d
    }

    /// Sends `signal` (a `kill` name like `HUP`) to the daemon.
    fn signal(&self, signal: &str) {
        let out = output_within(
            {
                let mut c = Command::new("kill");
                c.args([&format!("-{signal}"), &self.child.id().to_string()]);
                c
            },
            CMD,
        );
        assert!(out.status.success(), "kill -{signal}");
    }

    /// Waits for a log line containing `needle`.
    fn wait_log(&mut self, needle: &str, limit: Duration) -> bool {
        self.log.wait_for(needle, limit)
    }

    /// Waits for the daemon to exit (killed at `limit`) and collects its last lines.
    fn exit(&mut self, limit: Duration) -> ExitStatus {
        let status = wait_within(&mut self.child, limit);
        self.log.finish(Duration::from_secs(2));
        status
    }

    /// Everything it logged so far.
    fn text(&self) -> String {
        self.log.seen().join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A scratch directory for config files and sockets, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ipoib-cm-esvc-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self(dir)
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).expect("write");
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `ipoib-cm ARGS` in node `k`.
fn cli(lab: &Lab, k: usize, args: &[&str]) -> Output {
    let mut a = vec![BIN];
    a.extend_from_slice(args);
    output_within(lab.exec(k, &a), CMD)
}

/// `ipoib-cm ARGS` in node `k`, which must succeed; its stdout.
fn cli_ok(lab: &Lab, k: usize, args: &[&str]) -> String {
    let out = cli(lab, k, args);
    assert!(
        out.status.success(),
        "ipoib-cm {args:?} in node {k}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Node `k`'s status document (the only daemon of its namespace).
fn status(lab: &Lab, k: usize) -> serde_json::Value {
    serde_json::from_str(&cli_ok(lab, k, &["status", "--json"])).expect("status JSON")
}

/// One ping from node `k` to `ip` answered within a second.
fn ping(lab: &Lab, k: usize, ip: &str) -> bool {
    output_within(lab.exec(k, &["ping", "-n", "-c", "1", "-W", "1", ip]), CMD)
        .status
        .success()
}

/// Pings until one is answered, at most `tries` times.
fn ping_within(lab: &Lab, k: usize, ip: &str, tries: usize) -> bool {
    (0..tries).any(|_| ping(lab, k, ip))
}

/// The flags of node `k` in the lab's usual addressing.
fn node_args(k: usize) -> Vec<String> {
    vec![
        "--bind".into(),
        format!("198.18.0.{k}"),
        "--addr".into(),
        format!("198.19.0.{k}/24"),
    ]
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The (peer, qpn) pairs of a status document's TX connections.
fn tx_connections(s: &serde_json::Value) -> Vec<(String, u64)> {
    s["tx"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| {
                    (
                        t["peer"].as_str().unwrap_or_default().to_owned(),
                        t["qpn"].as_u64().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn sighup_reload_adds_a_neighbour_and_keeps_the_connection() {
    let lab = lab_or_skip!("esvc", 3, 9000);
    let scratch = Scratch::new("reload");
    let base = "bind = \"198.18.0.1\"\naddr = [\"198.19.0.1/24\"]\npeer = [\"198.18.0.2\"]\n";
    let conf = scratch.file("node1.toml", base);
    let conf_arg = conf.to_string_lossy().into_owned();
    let mut d1 = Daemon::start(&lab, 1, &["--config", &conf_arg], &[]);
    let mut a2 = node_args(2);
    a2.extend(["--peer".into(), "198.18.0.1".into()]);
    let _d2 = Daemon::start(&lab, 2, &refs(&a2), &[]);
    let mut a3 = node_args(3);
    a3.extend(["--peer".into(), "198.18.0.1".into()]);
    let _d3 = Daemon::start(&lab, 3, &refs(&a3), &[]);

    assert!(ping_within(&lab, 1, "198.19.0.2", 5), "{}", d1.text());
    let before = status(&lab, 1);
    let to_node2 = tx_connections(&before);
    assert_eq!(to_node2.len(), 1, "{before}");
    // Node 1's broadcasts reach node 2 only: node 3 cannot be resolved.
    assert!(
        !ping(&lab, 1, "198.19.0.3"),
        "node 3 answered before it was configured"
    );

    let hw3 = status(&lab, 3)["interface"]["hwaddr"]
        .as_str()
        .expect("hwaddr")
        .to_owned();
    // A file that also changes a setting fixed at start is refused whole: nothing of it
    // is applied, the neighbour included.
    scratch.file(
        "node1.toml",
        &format!("{base}neigh = [\"198.19.0.3={hw3}\"]\nmode = \"datagram\"\n"),
    );
    d1.signal("HUP");
    assert!(
        d1.wait_log(
            "reload refused, nothing applied: mode cannot change without a restart",
            CMD
        ),
        "no refusal: {}",
        d1.text()
    );
    assert!(
        !ping(&lab, 1, "198.19.0.3"),
        "the refused file's neighbour was applied"
    );
    scratch.file(
        "node1.toml",
        &format!("{base}neigh = [\"198.19.0.3={hw3}\"]\n"),
    );
    d1.signal("HUP");
    assert!(
        d1.wait_log("configuration reloaded: changed neigh", CMD),
        "no reload: {}",
        d1.text()
    );
    assert!(
        ping_within(&lab, 1, "198.19.0.3", 5),
        "the neighbour added in the file is not reachable: {}",
        d1.text()
    );
    assert!(ping(&lab, 1, "198.19.0.2"));
    let after = status(&lab, 1);
    let now = tx_connections(&after);
    assert!(
        now.contains(&to_node2[0]),
        "the connection to node 2 did not survive the reload: {to_node2:?} -> {now:?}"
    );
    assert_eq!(after["interface"]["mode"], "connected");
    assert_eq!(after["counters"]["tx_failed"], 0, "{after}");
    let n3 = after["neighbours"]
        .as_array()
        .and_then(|a| a.iter().find(|n| n["ip"] == "198.19.0.3").cloned())
        .expect("neighbour 198.19.0.3");
    assert_eq!(n3["hwaddr"], hw3.as_str());

    // An invalid file: one line, and the running configuration stays.
    scratch.file("node1.toml", "bind = \n");
    d1.signal("HUP");
    assert!(
        d1.wait_log("reload failed, keeping the running configuration", CMD),
        "{}",
        d1.text()
    );
    assert!(ping(&lab, 1, "198.19.0.3"), "{}", d1.text());
    assert!(
        tx_connections(&status(&lab, 1)).contains(&to_node2[0]),
        "{}",
        d1.text()
    );
    let reload = cli(&lab, 1, &["reload"]);
    assert_eq!(reload.status.code(), Some(2), "{reload:?}");
    let err = String::from_utf8_lossy(&reload.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("reload failed"), "{err}");

    d1.signal("TERM");
    assert!(d1.exit(CMD).success(), "{}", d1.text());
}

#[test]
fn runtime_control_neigh_peer_and_down() {
    let lab = lab_or_skip!("esvc", 2, 9000);
    // Node 1 has no peer: its ARP requests reach no one.
    let mut d1 = Daemon::start(&lab, 1, &refs(&node_args(1)), &[]);
    let mut a2 = node_args(2);
    a2.extend(["--peer".into(), "198.18.0.1".into()]);
    let _d2 = Daemon::start(&lab, 2, &refs(&a2), &[]);
    assert!(!ping(&lab, 1, "198.19.0.2"), "resolved with no peer");

    let hw2 = status(&lab, 2)["interface"]["hwaddr"]
        .as_str()
        .expect("hwaddr")
        .to_owned();
    let said = cli_ok(&lab, 1, &["neigh", "add", "198.19.0.2", &hw2]);
    assert!(said.contains("added"), "{said}");
    assert!(ping_within(&lab, 1, "198.19.0.2", 5), "{}", d1.text());
    let shown = cli_ok(&lab, 1, &["neigh", "show", "--ifname", "ib0"]);
    assert!(
        shown.contains(&format!("198.19.0.2 lladdr {hw2} permanent")),
        "{shown}"
    );

    cli_ok(&lab, 1, &["neigh", "del", "198.19.0.2"]);
    let shown = cli_ok(&lab, 1, &["neigh", "show"]);
    assert!(!shown.contains("198.19.0.2"), "{shown}");
    let again = cli(&lab, 1, &["neigh", "del", "198.19.0.2"]);
    assert_eq!(again.status.code(), Some(2));
    let err = String::from_utf8_lossy(&again.stderr);
    assert_eq!(
        err.trim(),
        "error: ipoib-cm neigh: the daemon for ib0 answered: neigh del 198.19.0.2: no static neighbour 198.19.0.2"
    );
    // The connection to the removed neighbour closes.
    let closed = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        tx_connections(&status(&lab, 1)).is_empty()
    });
    assert!(closed, "{}", status(&lab, 1));

    // With node 2 as a peer, ARP resolves it.
    cli_ok(&lab, 1, &["peer", "add", "198.18.0.2"]);
    assert!(ping_within(&lab, 1, "198.19.0.2", 5), "{}", d1.text());
    let wrong = cli(&lab, 1, &["peer", "add", "2001:db8::2"]);
    assert_eq!(wrong.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("not the same address family"),
        "{wrong:?}"
    );
    cli_ok(&lab, 1, &["peer", "del", "198.18.0.2"]);
    let gone = cli(&lab, 1, &["peer", "del", "198.18.0.2"]);
    assert_eq!(gone.status.code(), Some(2), "{gone:?}");

    let wrong_if = cli(
        &lab,
        1,
        &["down", "ib9", "--control-socket", "@ipoib-cm/ib0"],
    );
    assert_eq!(wrong_if.status.code(), Some(2), "{wrong_if:?}");
    let said = cli_ok(&lab, 1, &["down"]);
    assert!(said.contains("shutting down"), "{said}");
    let exit = d1.exit(CMD);
    assert!(exit.success(), "{exit:?}: {}", d1.text());
    assert!(d1.text().contains("down requested"), "{}", d1.text());
    let link = output_within(lab.exec(1, &["ip", "link", "show", "ib0"]), CMD);
    assert!(!link.status.success(), "ib0 is still there");
}

#[test]
fn a_deleted_interface_ends_the_daemon_cleanly() {
    let lab = lab_or_skip!("esvc", 2, 9000);
    let mut a1 = node_args(1);
    a1.extend(["--peer".into(), "198.18.0.2".into()]);
    let mut d1 = Daemon::start(&lab, 1, &refs(&a1), &[]);
    let mut a2 = node_args(2);
    a2.extend(["--peer".into(), "198.18.0.1".into()]);
    let _d2 = Daemon::start(&lab, 2, &refs(&a2), &[]);
    assert!(ping_within(&lab, 1, "198.19.0.2", 5));
    assert!(ping_within(&lab, 2, "198.19.0.1", 5));
    let dreqs_before = status(&lab, 2)["counters"]["rx_dreq_reaped"]
        .as_u64()
        .unwrap_or(0);

    let del = output_within(lab.exec(1, &["ip", "link", "del", "ib0"]), CMD);
    assert!(del.status.success(), "{del:?}");
    let t0 = Instant::now();
    let exit = d1.exit(CMD);
    let took = t0.elapsed();
    let log = d1.text();
    println!("daemon ended {took:?} after ip link del: {exit:?}\n{log}");
    assert!(exit.success(), "{exit:?}: {log}");
    assert!(
        log.contains("interface ib0 was removed; shutting down"),
        "{log}"
    );
    assert!(!log.contains("os error"), "{log}");
    // Node 2 saw the DREQs: its RX connection from node 1 is reaped at once, not after
    // rx_timeout.
    let reaped = (0..30).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        status(&lab, 2)["counters"]["rx_dreq_reaped"].as_u64() > Some(dreqs_before)
    });
    assert!(reaped, "{}", status(&lab, 2));
    // The socket is gone with the daemon.
    let st = cli(&lab, 1, &["status"]);
    assert_eq!(st.status.code(), Some(1), "{st:?}");
}

#[test]
fn default_sockets_are_per_namespace_and_status_finds_every_daemon() {
    let lab = lab_or_skip!("esvc", 2, 9000);
    // ib0 in both namespaces, both on the default control socket.
    let _d1 = Daemon::start(&lab, 1, &refs(&node_args(1)), &[]);
    let _d2 = Daemon::start(&lab, 2, &refs(&node_args(2)), &[]);
    let s1 = status(&lab, 1);
    let s2 = status(&lab, 2);
    assert_eq!(s1["interface"]["name"], "ib0");
    assert_eq!(s2["interface"]["name"], "ib0");
    assert_ne!(s1["interface"]["hwaddr"], s2["interface"]["hwaddr"]);

    // A second interface in namespace 1, on a second underlay address.
    let add = output_within(
        lab.exec(1, &["ip", "addr", "add", "198.18.0.101/24", "dev", "eth0"]),
        CMD,
    );
    assert!(add.status.success(), "{add:?}");
    let _d1b = Daemon::start(
        &lab,
        1,
        &[
            "--ifname",
            "ib1",
            "--bind",
            "198.18.0.101",
            "--addr",
            "198.19.1.1/24",
        ],
        &[],
    );
    let all: serde_json::Value =
        serde_json::from_str(&cli_ok(&lab, 1, &["status", "--json"])).expect("JSON");
    let names: Vec<&str> = all
        .as_array()
        .expect("one document per daemon")
        .iter()
        .filter_map(|s| s["interface"]["name"].as_str())
        .collect();
    assert_eq!(names, ["ib0", "ib1"]);
    let text = cli_ok(&lab, 1, &["status"]);
    assert!(text.contains("ib0") && text.contains("ib1"), "{text}");
    let one = status_named(&lab, 1, "ib1");
    assert_eq!(one["interface"]["name"], "ib1");
    assert_eq!(status(&lab, 2)["interface"]["name"], "ib0");

    let ambiguous = cli(&lab, 1, &["down"]);
    assert_eq!(ambiguous.status.code(), Some(2), "{ambiguous:?}");
    assert!(
        String::from_utf8_lossy(&ambiguous.stderr).contains("several daemons"),
        "{ambiguous:?}"
    );
    let wrong = cli(
        &lab,
        1,
        &["status", "ib1", "--control-socket", "@ipoib-cm/ib0"],
    );
    assert_eq!(wrong.status.code(), Some(2), "{wrong:?}");
    assert_eq!(
        String::from_utf8_lossy(&wrong.stderr).trim(),
        "error: ipoib-cm status: @ipoib-cm/ib0 serves ib0, not ib1"
    );
}

/// `status IFNAME --json` in node `k`.
fn status_named(lab: &Lab, k: usize, ifname: &str) -> serde_json::Value {
    serde_json::from_str(&cli_ok(lab, k, &["status", ifname, "--json"])).expect("status JSON")
}

/// Receives notification datagrams until one equals or starts with `want`, within `limit`;
/// returns every message seen.
fn notifications_until(sock: &UnixDatagram, want: &str, limit: Duration) -> (bool, Vec<String>) {
    let end = Instant::now() + limit;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < end && seen.len() < 10_000 {
        let left = end.saturating_duration_since(Instant::now());
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("timeout");
        match sock.recv(&mut buf) {
            Ok(k) => {
                let m = String::from_utf8_lossy(&buf[..k]).into_owned();
                let hit = m.starts_with(want);
                seen.push(m);
                if hit {
                    return (true, seen);
                }
            }
            Err(_) => break,
        }
    }
    (false, seen)
}

#[test]
fn systemd_notifications_reach_a_fake_notify_socket() {
    let lab = lab_or_skip!("esvc", 2, 9000);
    let scratch = Scratch::new("notify");
    let sock_path: PathBuf = scratch.0.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind notify socket");
    let conf = scratch.file(
        "node1.toml",
        "bind = \"198.18.0.1\"\naddr = [\"198.19.0.1/24\"]\n",
    );
    let conf_arg = conf.to_string_lossy().into_owned();
    let notify = sock_path.to_string_lossy().into_owned();
    let mut d = Daemon::start(
        &lab,
        1,
        &["--config", &conf_arg],
        &[("NOTIFY_SOCKET", &notify), ("WATCHDOG_USEC", "400000")],
    );
    let (ready, seen) = notifications_until(&sock, "READY=1", CMD);
    assert!(ready, "{seen:?}\n{}", d.text());
    // The control socket listens by then.
    assert_eq!(status(&lab, 1)["interface"]["name"], "ib0");
    // WATCHDOG=1 every 200 ms: at least 3 in a second and a half (generous).
    let t0 = Instant::now();
    let mut watchdogs = 0;
    while watchdogs < 3 && t0.elapsed() < Duration::from_secs(5) {
        let (hit, seen) = notifications_until(&sock, "WATCHDOG=1", Duration::from_secs(2));
        assert!(hit, "no WATCHDOG=1: {seen:?}");
        watchdogs += 1;
    }
    println!("3 watchdog notifications in {:?}", t0.elapsed());
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());

    d.signal("HUP");
    let (hit, seen) = notifications_until(&sock, "RELOADING=1", CMD);
    assert!(hit, "{seen:?}");
    assert!(
        seen.last().is_some_and(|m| m.contains("MONOTONIC_USEC=")),
        "{seen:?}"
    );
    let (hit, seen) = notifications_until(&sock, "READY=1", CMD);
    assert!(hit, "{seen:?}");

    d.signal("TERM");
    let (hit, seen) = notifications_until(&sock, "STOPPING=1", CMD);
    assert!(hit, "{seen:?}");
    assert!(d.exit(CMD).success(), "{}", d.text());
    assert!(Path::new(&sock_path).exists());
}

/// Debian's python3 (scripts/setup.sh installs it).
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// How long root's control request may take to be answered while others crowd the socket.
const CONTROL_ANSWER: Duration = Duration::from_millis(100);

/// Python: holds N connections to the abstract socket `@ipoib-cm/ib0`, closes and reopens all
/// of them every EVERY seconds for SECS seconds; prints how many it made.
const CROWD: &str = r#"
import socket, sys, time
n, every, secs = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
end, held, made = time.monotonic() + secs, [], 0
while time.monotonic() < end:
    for s in held:
        s.close()
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect("\0ipoib-cm/ib0")
            held.append(s)
        except OSError:
            s.close()
    made += len(held)
    time.sleep(min(every, max(0.0, end - time.monotonic())))
print(made)
"#;

/// Python: sends each request (one argument each) to `@ipoib-cm/ib0` on a new connection,
/// 100 ms apart (a crowd's reconnects fall between some of them), reads the answer to EOF (at
/// most 5 s) and prints `MILLISECONDS ANSWER` per request.
const ASK: &str = r#"
import socket, sys, time
for req in sys.argv[1:]:
    t0 = time.monotonic()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    out = b""
    try:
        s.connect("\0ipoib-cm/ib0")
        s.sendall(req.encode() + b"\n")
        while len(out) < 1 << 20:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except OSError as e:
        out = repr(e).encode()
    s.close()
    line = out.decode(errors="replace").splitlines()[0] if out else "(nothing)"
    print("%.1f %s" % ((time.monotonic() - t0) * 1e3, line[:60]), flush=True)
    time.sleep(0.1)
"#;

/// Runs [`ASK`] in node `k` as root; the (milliseconds, first line of the answer) per request.
fn ask(lab: &Lab, k: usize, requests: &[&str]) -> Vec<(f64, String)> {
    let mut a = vec![SYSTEM_PYTHON, "-c", ASK];
    a.extend_from_slice(requests);
    let out = output_within(lab.exec(k, &a), CMD);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (ms, answer) = l.split_once(' ')?;
            Some((ms.parse().ok()?, answer.to_owned()))
        })
        .collect()
}

/// Starts [`CROWD`] in node `k`, as user nobody when `nobody`.
fn crowd(lab: &Lab, k: usize, nobody: bool, secs: u32) -> Child {
    let secs = secs.to_string();
    let mut a: Vec<&str> = Vec::new();
    if nobody {
        a.extend([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]);
    }
    // The system's python3: one under root's home (pyenv) is not nobody's to run.
    a.extend([SYSTEM_PYTHON, "-c", CROWD, "200", "0.9", &secs]);
    lab.exec(k, &a)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn crowd")
}

/// Waits for a [`crowd`] to end; how many connections it made.
fn crowd_made(c: &mut Child) -> u64 {
    let _ = wait_within(c, Duration::from_secs(10));
    let mut out = String::new();
    if let Some(mut o) = c.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut o, &mut out);
    }
    out.trim().parse().unwrap_or(0)
}

/// Checks that every request was answered by the daemon within [`CONTROL_ANSWER`]; returns
/// the failures and prints the figures.
fn answered_in_time(what: &str, got: &[(f64, String)], want: usize) -> Vec<String> {
    let max = got.iter().map(|(ms, _)| *ms).fold(0.0, f64::max);
    println!(
        "{what}: {} of {want} got an answer, max {max:.1} ms",
        got.len()
    );
    let mut failures = Vec::new();
    if got.len() != want {
        failures.push(format!("{what}: {} of {want} requests answered", got.len()));
    }
    for (ms, answer) in got {
        let refused = answer.contains("too many control clients") || answer.contains("Error");
        if refused || !answer.starts_with('{') || *ms > CONTROL_ANSWER.as_secs_f64() * 1e3 {
            failures.push(format!("{what}: {ms:.1} ms: {answer}"));
        }
    }
    failures
}

#[test]
fn no_one_locks_root_out_of_the_control_socket() {
    let lab = lab_or_skip!("ectl", 2, 1500);
    if Command::new("setpriv").arg("--version").output().is_err()
        || Command::new(SYSTEM_PYTHON)
            .arg("--version")
            .output()
            .is_err()
    {
        println!("skipped: needs setpriv and python3");
        return;
    }
    let scratch = Scratch::new("ctl");
    let config = scratch.file("ib0.conf", "");
    let mut args = node_args(1);
    args.extend(["--config".into(), config.display().to_string()]);
    let mut d = Daemon::start(&lab, 1, &refs(&args), &[]);
    let mut failures = Vec::new();
    for (what, nobody) in [
        ("200 idle clients of nobody", true),
        ("200 idle clients of root", false),
    ] {
        let mut c = crowd(&lab, 1, nobody, 6);
        std::thread::sleep(Duration::from_secs(1));
        let mut requests = vec!["status json"; 20];
        requests.extend(["reload"; 5]);
        let got = ask(&lab, 1, &requests);
        failures.extend(answered_in_time(what, &got, requests.len()));
        println!("{what}: {} connections made", crowd_made(&mut c));
    }
    let mut c = crowd(&lab, 1, true, 3);
    std::thread::sleep(Duration::from_secs(1));
    let got = ask(&lab, 1, &["down"]);
    failures.extend(answered_in_time("down, nobody crowding", &got, 1));
    crowd_made(&mut c);
    let exit = d.exit(CMD);
    assert!(exit.success(), "{exit:?}: {}", d.text());
    assert!(failures.is_empty(), "{failures:#?}\n{}", d.text());
}

/// `ping -q -c COUNT -i 0.01 -W 1 IP` in node `k`, started; see [`ping_outcome`].
fn ping_flood(lab: &Lab, k: usize, ip: &str, count: u32) -> Child {
    let count = count.to_string();
    lab.exec(
        k,
        &[
            "ping", "-n", "-q", "-c", &count, "-i", "0.01", "-W", "1", ip,
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("spawn ping")
}

/// A [`ping_flood`]'s (sent, received, max RTT in ms), once it ended.
fn ping_outcome(mut p: Child) -> (u32, u32, f64) {
    let _ = wait_within(&mut p, Duration::from_secs(60));
    let mut out = String::new();
    if let Some(mut o) = p.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut o, &mut out);
    }
    let num = |s: &str| s.trim().split(' ').next().and_then(|n| n.parse().ok());
    let mut sent_received = (0, 0);
    let mut max = f64::NAN;
    for line in out.lines() {
        if let Some((a, b)) = line.split_once(" packets transmitted, ") {
            sent_received = (num(a).unwrap_or(0), num(b).unwrap_or(0));
        }
        if let Some(rtt) = line.split(" = ").nth(1) {
            max = rtt
                .split('/')
                .nth(2)
                .and_then(|m| m.parse().ok())
                .unwrap_or(f64::NAN);
        }
    }
    (sent_received.0, sent_received.1, max)
}

/// A static neighbour line for the config file: 198.19.(100 + i / 250).(i % 250 + 1), a soft
/// daemon's hardware address for underlay 198.18.(100 + i / 250).(i % 250 + 1).
fn neigh_line(i: usize) -> String {
    let (a, b) = (100 + i / 250, i % 250 + 1);
    format!("  \"198.19.{a}.{b}=80:00:00:11:00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:{a:02x}:{b:02x}\",\n")
}

#[test]
fn a_reload_never_stalls_the_loop() {
    let lab = lab_or_skip!("erld", 2, 1500);
    let scratch = Scratch::new("stall");
    let base = "bind = \"198.18.0.1\"\naddr = [\"198.19.0.1/24\"]\npeer = [\"198.18.0.2\"]\n";
    let real = scratch.file("real.toml", base);
    let conf = scratch.0.join("node1.toml");
    std::os::unix::fs::symlink(&real, &conf).expect("symlink");
    let conf_arg = conf.to_string_lossy().into_owned();
    let mut d1 = Daemon::start(&lab, 1, &["--config", &conf_arg], &[]);
    let mut a2 = node_args(2);
    a2.extend(["--peer".into(), "198.18.0.1".into()]);
    let _d2 = Daemon::start(&lab, 2, &refs(&a2), &[]);
    assert!(ping_within(&lab, 1, "198.19.0.2", 5), "{}", d1.text());

    let mut failures = Vec::new();
    // The path turns into a symlink to a FIFO (no writer), then to /dev/zero.
    let fifo = scratch.0.join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status();
    let mut targets = vec![(Path::new("/dev/zero").to_owned(), "/dev/zero")];
    if made.is_ok_and(|s| s.success()) {
        targets.insert(0, (fifo.clone(), "a FIFO"));
    }
    for (target, what) in &targets {
        let _ = std::fs::remove_file(&conf);
        std::os::unix::fs::symlink(target, &conf).expect("symlink");
        let p = ping_flood(&lab, 1, "198.19.0.2", 200);
        d1.signal("HUP");
        let st = cli(&lab, 1, &["status", "--json"]);
        let (sent, got, max) = ping_outcome(p);
        println!("config -> {what}: {got} of {sent} pings answered, max {max:.1} ms");
        if !st.status.success() || got != sent || sent == 0 {
            failures.push(format!(
                "config -> {what}: {got} of {sent} pings, status answered: {}",
                st.status.success()
            ));
        }
        if !d1.wait_log("not a regular file", CMD) {
            failures.push(format!("config -> {what}: no one-line refusal"));
        }
    }

    // A 4,096-neighbour file under 200 SIGHUPs a second for 4 s.
    let mut big = String::from(base);
    big.push_str("neigh = [\n");
    for i in 0..4096 {
        big.push_str(&neigh_line(i));
    }
    big.push_str("]\n");
    let real = scratch.file("real.toml", &big);
    let _ = std::fs::remove_file(&conf);
    std::os::unix::fs::symlink(&real, &conf).expect("symlink");
    let p = ping_flood(&lab, 1, "198.19.0.2", 400);
    let t0 = Instant::now();
    // 800 SIGHUPs 5 ms apart, from the shell's own `kill` (no process per signal).
    let storm = output_within(
        {
            let mut c = Command::new("sh");
            c.args([
                "-c",
                "i=0; while [ $i -lt 800 ]; do kill -HUP $0 || exit 1; i=$((i+1)); sleep 0.005; done",
                &d1.child.id().to_string(),
            ]);
            c
        },
        Duration::from_secs(30),
    );
    let storm_s = t0.elapsed().as_secs_f64();
    let st = cli(&lab, 1, &["status", "--json"]);
    let (sent, got, max) = ping_outcome(p);
    let reloaded = d1.wait_log("configuration reloaded", CMD);
    let reloads = d1.text().matches("configuration reloaded").count();
    println!(
        "4,096 neighbours, 800 SIGHUPs in {storm_s:.1} s: {got} of {sent} pings answered, max {max:.1} ms, {reloads} reloads logged"
    );
    if !storm.status.success() {
        failures.push(format!("SIGHUP storm: kill failed: {storm:?}"));
    }
    if !st.status.success() || got != sent || sent == 0 {
        failures.push(format!(
            "SIGHUP storm: {got} of {sent} pings, max {max:.1} ms, status answered: {}",
            st.status.success()
        ));
    }
    if !reloaded {
        failures.push("SIGHUP storm: no reload applied".to_owned());
    }
    d1.signal("TERM");
    let exit = d1.exit(CMD);
    if !exit.success() {
        failures.push(format!("SIGTERM: {exit:?}"));
    }
    assert!(failures.is_empty(), "{failures:#?}\n{}", d1.text());
}
