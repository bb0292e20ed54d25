//! A throw-away network-namespace lab for end-to-end tests.
//!
//! [`Lab::new`] builds `n` node namespaces plus one bridge namespace:
//!
//! ```text
//!   <prefix><pid>.<seq>-1        <prefix><pid>.<seq>-2   ...   <prefix><pid>.<seq>-N
//!   eth0 198.18.0.1/24           eth0 198.18.0.2/24           eth0 198.18.0.N/24
//!        |                            |                            |
//!        +---- p1 ---------- br0 ---- p2 ------- ... ------------ pN   (<prefix><pid>.<seq>-br)
//! ```
//!
//! All links (and every namespace's loopback) are up and use the lab's underlay MTU. Nothing is
//! created in the root namespace. `<seq>` counts labs within one process, so tests of one binary
//! can run their labs in parallel.
//!
//! [`Drop`] kills every process still inside the lab's namespaces and deletes them, also when
//! the test panics. Namespaces left behind by a test process that was killed outright (its
//! `<pid>` no longer exists) are deleted by the next [`Lab::new`] with the same prefix.
//!
//! Tests that cannot build a lab (not root, no `ip netns`) get a [`Skip`], print it and pass.

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::net::Ipv4Addr;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

/// The interface name of every node's underlay link.
pub(crate) const IFNAME: &str = "eth0";

/// The reason a test cannot run here; the test prints it and passes.
#[derive(Debug)]
pub(crate) struct Skip(pub(crate) String);

impl Skip {
    /// Prints `skipped: <reason>` to stdout (shown with `--nocapture` and on failure).
    pub(crate) fn print(&self) {
        println!("{self}");
    }
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "skipped: {}", self.0)
    }
}

/// Builds a [`Lab`] or prints why not and returns from the test.
#[macro_export]
macro_rules! lab_or_skip {
    ($prefix:expr, $nodes:expr, $mtu:expr) => {
        match $crate::common::netns::Lab::new($prefix, $nodes, $mtu) {
            Ok(lab) => lab,
            Err(skip) => {
                skip.print();
                return;
            }
        }
    };
}

/// A set of network namespaces joined by a bridge; see the module docs.
#[derive(Debug)]
pub(crate) struct Lab {
    /// Node namespaces, node k at index k - 1.
    nodes: Vec<String>,
    /// Every namespace created so far (bridge first), deleted in reverse order on drop.
    created: Vec<String>,
    mtu: u32,
}

/// Labs created by this process so far.
static LABS: AtomicUsize = AtomicUsize::new(0);

impl Lab {
    /// Creates `n_nodes` namespaces `<prefix><pid>.<seq>-<k>` (k = 1..=n) with `eth0` =
    /// 198.18.0.k/24, all bridged in `<prefix><pid>.<seq>-br`, links at `underlay_mtu`.
    ///
    /// Returns [`Skip`] when not root, when `ip` is missing or when `ip netns add` fails; panics
    /// (after cleaning up) when a later setup step fails, since that is a harness bug.
    pub(crate) fn new(prefix: &str, n_nodes: usize, underlay_mtu: u32) -> Result<Self, Skip> {
        assert!((2..=253).contains(&n_nodes), "2..=253 nodes, not {n_nodes}");
        assert!((68..=65535).contains(&underlay_mtu), "MTU {underlay_mtu}");
        assert!(
            prefix.chars().all(|c| c.is_ascii_alphabetic()),
            "prefix {prefix:?}: letters only, so stale namespaces can be recognised"
        );
        if effective_uid() != Some(0) {
            return Err(Skip("needs root to create network namespaces".into()));
        }
        match Command::new("ip").arg("-V").output() {
            Ok(o) if o.status.success() => {}
            _ => return Err(Skip("iproute2's `ip` is not installed".into())),
        }
        remove_stale(prefix);

        let seq = LABS.fetch_add(1, Ordering::Relaxed);
        let base = format!("{prefix}{}.{seq}", std::process::id());
        let bridge = format!("{base}-br");
        let mut lab = Self {
            nodes: Vec::new(),
            created: Vec::new(),
            mtu: underlay_mtu,
        };
        // From here on `lab` owns whatever exists, so an early return or a panic cleans up.
        let out = ip(&["netns", "add", &bridge]);
        if !out.status.success() {
            return Err(Skip(format!(
                "`ip netns add {bridge}` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        lab.created.push(bridge.clone());
        let mtu = underlay_mtu.to_string();
        ip_ok(&["-n", &bridge, "link", "set", "lo", "up"]);
        ip_ok(&[
            "-n",
            &bridge,
            "link",
            "add",
            "br0",
            "type",
            "bridge",
            "stp_state",
            "0",
        ]);
        for k in 1..=n_nodes {
            let node = format!("{base}-{k}");
            ip_ok(&["netns", "add", &node]);
            lab.created.push(node.clone());
            lab.nodes.push(node.clone());
            let port = format!("p{k}");
            ip_ok(&["-n", &node, "link", "set", "lo", "up"]);
            // Both ends are created directly in their namespaces; the root namespace never
            // sees them.
            ip_ok(&[
                "-n", &bridge, "link", "add", &port, "mtu", &mtu, "type", "veth", "peer", "name",
                IFNAME, "mtu", &mtu, "netns", &node,
            ]);
            ip_ok(&["-n", &bridge, "link", "set", &port, "master", "br0", "up"]);
            ip_ok(&["-n", &node, "link", "set", IFNAME, "up"]);
            let cidr = format!("{}/24", lab.addr(k));
            ip_ok(&["-n", &node, "addr", "add", &cidr, "dev", IFNAME]);
        }
        ip_ok(&["-n", &bridge, "link", "set", "br0", "mtu", &mtu, "up"]);
        Ok(lab)
    }

    /// Number of nodes.
    pub(crate) fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The underlay MTU of every link.
    pub(crate) fn mtu(&self) -> u32 {
        self.mtu
    }

    /// Namespace name of node `k` (1-based).
    pub(crate) fn ns(&self, k: usize) -> &str {
        assert!((1..=self.nodes.len()).contains(&k), "no node {k}");
        &self.nodes[k - 1]
    }

    /// Underlay address of node `k`: 198.18.0.k.
    pub(crate) fn addr(&self, k: usize) -> Ipv4Addr {
        let last = u8::try_from(k).expect("node number fits a byte");
        Ipv4Addr::new(198, 18, 0, last)
    }

    /// `ip netns exec <node k> args...`, not yet started. Environment and working directory
    /// are inherited as usual.
    pub(crate) fn exec<S: AsRef<std::ffi::OsStr>>(&self, k: usize, args: &[S]) -> Command {
        assert!(!args.is_empty(), "nothing to exec");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.ns(k)]).args(args);
        cmd
    }

    /// Starts `args` in node `k` with stdin closed and stdout/stderr piped (read them, e.g.
    /// with [`Lines`], or the process may block on a full pipe). Whatever still runs in the
    /// lab's namespaces when the lab drops is killed.
    pub(crate) fn spawn<S: AsRef<std::ffi::OsStr>>(&self, k: usize, args: &[S]) -> Child {
        let mut cmd = self.exec(k, args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.created.iter().rev() {
            kill_all_in(ns);
            let out = ip(&["netns", "del", ns]);
            if !out.status.success() {
                eprintln!(
                    "netns lab: `ip netns del {ns}` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
    }
}

/// Runs `server` in node 1, then `client` with node 1's address appended in node 2 (retried
/// while the server is not listening yet: stderr says "Couldn't connect" or "no answer");
/// returns both stdouts after checking that both exited 0 within `limit`.
pub(crate) fn server_and_client(
    lab: &Lab,
    server: &[&str],
    client: &[&str],
    limit: Duration,
) -> (String, String) {
    let mut server_cmd = lab.exec(1, server);
    server_cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut server = server_cmd.spawn().expect("spawn server");
    let mut srv_out = Lines::new(server.stdout.take().expect("stdout"));
    let mut srv_err = Lines::new(server.stderr.take().expect("stderr"));
    let peer = lab.addr(1).to_string();
    let mut cli_args = client.to_vec();
    cli_args.push(&peer);
    // The server listens before it prints anything; give it a moment, then retry the client
    // a few times in case it was not listening yet.
    let mut client_out = None;
    for _ in 0..20 {
        thread::sleep(Duration::from_millis(100));
        let out = output_within(lab.exec(2, &cli_args), limit);
        let text = String::from_utf8_lossy(&out.stderr).to_string();
        if text.contains("Couldn't connect") || text.contains("no answer") {
            continue;
        }
        client_out = Some(out);
        break;
    }
    let client = client_out.expect("client never connected");
    let status = wait_within(&mut server, limit);
    let server_text = srv_out.finish(Duration::from_secs(2)).join("\n");
    let server_err = srv_err.finish(Duration::from_secs(2)).join("\n");
    let client_text = String::from_utf8_lossy(&client.stdout).to_string();
    assert!(
        client.status.success(),
        "client failed: {client_text}\n{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        status.success(),
        "server failed: {server_text}\n{server_err}"
    );
    (server_text, client_text)
}

/// Runs `cmd` to completion with stdout and stderr captured, killing it at `timeout`.
///
/// Panics if it cannot be started. A killed command comes back with a failed status and
/// whatever output it had produced.
pub(crate) fn output_within(mut cmd: Command, timeout: Duration) -> Output {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let stdout = child.stdout.take().map(read_to_end_thread);
    let stderr = child.stderr.take().map(read_to_end_thread);
    let status = wait_within(&mut child, timeout);
    let join = |h: Option<thread::JoinHandle<Vec<u8>>>| {
        h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
    };
    Output {
        status,
        stdout: join(stdout),
        stderr: join(stderr),
    }
}

/// Waits for `child` to exit, killing it at `timeout`; returns its exit status (which shows a
/// signal when it was killed).
pub(crate) fn wait_within(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status,
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                eprintln!("netns lab: killing pid {} after {timeout:?}", child.id());
                let _ = child.kill();
                return child.wait().expect("wait after kill");
            }
            Err(e) => panic!("waiting for pid {}: {e}", child.id()),
        }
    }
}

/// The lines of a child's output, read on a background thread so the child never blocks on a
/// full pipe.
#[derive(Debug)]
pub(crate) struct Lines {
    rx: Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    /// Starts reading `from` (e.g. `child.stdout.take().unwrap()`) line by line.
    pub(crate) fn new(from: impl Read + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(from).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits until a line containing `needle` arrives; false at `timeout` or end of output.
    pub(crate) fn wait_for(&mut self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.seen.push(line);
                    if hit {
                        return true;
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    /// Collects lines until the output ends or `timeout` passes; returns everything seen so far.
    pub(crate) fn finish(&mut self, timeout: Duration) -> &[String] {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => return &self.seen,
            }
        }
    }

    /// Every line received so far.
    pub(crate) fn seen(&self) -> &[String] {
        &self.seen
    }
}

fn read_to_end_thread(mut from: impl Read + Send + 'static) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = from.read_to_end(&mut buf);
        buf
    })
}

/// Runs `ip args...` and returns its output (an `ip` that cannot be run reads as a failure).
fn ip(args: &[&str]) -> Output {
    output_within(
        {
            let mut cmd = Command::new("ip");
            cmd.args(args);
            cmd
        },
        Duration::from_secs(10),
    )
}

/// Runs `ip args...` and panics with its stderr if it fails.
fn ip_ok(args: &[&str]) {
    let out = ip(args);
    assert!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// SIGKILLs every process inside namespace `ns` (bounded: `ip netns pids` lists a finite set).
fn kill_all_in(ns: &str) {
    let out = ip(&["netns", "pids", ns]);
    let pids = String::from_utf8_lossy(&out.stdout);
    for pid in pids.split_whitespace().filter(|p| p.parse::<u32>().is_ok()) {
        let _ = output_within(
            {
                let mut cmd = Command::new("kill");
                cmd.args(["-KILL", pid]);
                cmd
            },
            Duration::from_secs(5),
        );
    }
}

/// Deletes namespaces `<prefix><pid>.*` whose `<pid>` is no longer running.
fn remove_stale(prefix: &str) {
    let out = ip(&["netns", "list"]);
    let list = String::from_utf8_lossy(&out.stdout);
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let Some((pid, _)) = rest.split_once('.') else {
            continue;
        };
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        eprintln!("netns lab: removing stale namespace {name}");
        kill_all_in(name);
        let _ = ip(&["netns", "del", name]);
    }
}

/// The effective uid, from `/proc/self/status` (no libc call needed).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}
