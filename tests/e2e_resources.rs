//! The host's limits met at start, end to end: a memory cgroup that cannot hold what the
//! settings need, and an `RLIMIT_NOFILE` too low for the descriptors they need, end `up` at
//! once with one line and exit status 2 (never an OOM kill under the first heavy traffic, never
//! a control socket that does not answer); a cgroup at the figure `up` names carries a stream
//! both ways; a low soft `RLIMIT_NOFILE` is raised to the hard limit; at the lowest
//! `RLIMIT_NOFILE` it starts with, 12 concurrent `status` calls all answer.
//!
//! Each test builds its own namespaces (prefix `ipres`, 198.18.0.0/24) and memory cgroups
//! (`ipoib-cm-test-PID-N`, beside or below this process's own) and removes them; without root,
//! a memory cgroup, `nsenter` or `prlimit` they print `skipped: ...` and pass. A daemon that
//! must read its cgroup runs under `nsenter --net`, which keeps the host's cgroup mounts (`ip
//! netns exec` mounts a /sys of its own, without them).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::netns::{output_within, Lab, Lines};

const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");

/// How long a daemon that should refuse to start may take to do so.
const START_LIMIT: Duration = Duration::from_secs(20);

/// A memory cgroup of the test's own, removed on drop (after whatever still runs in it was
/// killed by the lab).
struct MemCgroup {
    dir: PathBuf,
    v2: bool,
}

static CGROUPS: AtomicUsize = AtomicUsize::new(0);

/// Why no memory cgroup of the test's own could be made here.
#[derive(Debug, thiserror::Error)]
enum NoCgroup {
    #[error("/proc/self/cgroup: {0}")]
    Own(std::io::Error),
    #[error("no memory cgroup")]
    NoMemoryController,
    #[error("mkdir {}: {source}", dir.display())]
    Create {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("{file} of {}: {source}", dir.display())]
    Limit {
        file: &'static str,
        dir: PathBuf,
        source: std::io::Error,
    },
}

impl MemCgroup {
    /// A new cgroup limited to `limit` bytes: below this process's own on cgroup v1, beside it
    /// on v2 (whose parent hands the memory controller down); `Err` says why not here.
    fn new(limit: u64) -> Result<Self, NoCgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(NoCgroup::Own)?;
        let name = format!(
            "ipoib-cm-test-{}-{}",
            std::process::id(),
            CGROUPS.fetch_add(1, Ordering::Relaxed)
        );
        let v1 = own.lines().find_map(|l| {
            let mut fields = l.splitn(3, ':');
            let controllers = fields.nth(1)?;
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| fields.next().map(str::to_owned))?
        });
        let (dir, v2) = match v1 {
            Some(path) if Path::new("/sys/fs/cgroup/memory").is_dir() => (
                Path::new("/sys/fs/cgroup/memory")
                    .join(path.trim_start_matches('/'))
                    .join(name),
                false,
            ),
            _ => {
                let path = own
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .ok_or(NoCgroup::NoMemoryController)?;
                // Beside our own cgroup (processes live only in leaves), or below the root.
                let root = Path::new("/sys/fs/cgroup");
                let parent = match Path::new(path).parent() {
                    Some(p) => root.join(p.strip_prefix("/").unwrap_or(p)),
                    None => root.to_path_buf(),
                };
                (parent.join(name), true)
            }
        };
        if let Err(source) = std::fs::create_dir(&dir) {
            return Err(NoCgroup::Create { dir, source });
        }
        let cg = Self { dir, v2 };
        let file = if v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        std::fs::write(cg.dir.join(file), limit.to_string()).map_err(|source| NoCgroup::Limit {
            file,
            dir: cg.dir.clone(),
            source,
        })?;
        Ok(cg)
    }

    /// A shell command that moves the shell into the cgroup (to be followed by `exec ...`).
    fn enter(&self) -> String {
        format!("echo $$ > {}/cgroup.procs", self.dir.display())
    }

    /// OOM kills in the cgroup so far.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // Its processes may take a moment to be gone.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove cgroup {}", self.dir.display());
    }
}

/// Builds the lab and a cgroup limited to `limit`, or prints why not and returns `None`.
fn lab_and_cgroup(prefix: &str, limit: u64) -> Option<(Lab, MemCgroup)> {
    let lab = match Lab::new(prefix, 2, 1500) {
        Ok(lab) => lab,
        Err(skip) => {
            skip.print();
            return None;
        }
    };
    if Command::new("nsenter").arg("--version").output().is_err() {
        println!("skipped: no nsenter");
        return None;
    }
    match MemCgroup::new(limit) {
        Ok(cg) => Some((lab, cg)),
        Err(why) => {
            println!("skipped: no memory cgroup of our own here: {why}");
            None
        }
    }
}

/// [`lab_and_cgroup`] with a 16 MiB cgroup (too small: `up` names its figure there), where
/// iperf3 is installed.
fn lab_cgroup_and_iperf3(prefix: &str) -> Option<(Lab, MemCgroup)> {
    if Command::new("iperf3").arg("--version").output().is_err() {
        println!("skipped: no iperf3");
        return None;
    }
    lab_and_cgroup(prefix, 16 << 20)
}

/// A control socket path of this test process.
fn socket(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ipres-{tag}-{}.sock", std::process::id()))
}

/// `up` on node `k` of `lab` (ib address 198.19.0.k, the other node its peer) with `extra`
/// arguments.
fn up_args(lab: &Lab, k: usize, sock: &Path, extra: &[&str]) -> Vec<String> {
    let other = 3 - k;
    let mut args: Vec<String> = [
        BIN,
        "up",
        "--ifname",
        "ipres0",
        "--bind",
        &lab.addr(k).to_string(),
        "--peer",
        &lab.addr(other).to_string(),
        "--addr",
        &format!("198.19.0.{k}/24"),
        "--control-socket",
        sock.to_str().expect("utf-8 path"),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

/// Runs `up` on node `k` inside `cg`, under `nsenter --net` so that it sees its cgroup; its
/// output once it exits (killed after [`START_LIMIT`]).
fn up_in_cgroup(lab: &Lab, cg: &MemCgroup, k: usize, sock: &Path, extra: &[&str]) -> Output {
    let netns = Path::new("/run/netns").join(lab.ns(k));
    let script = format!(
        "{} && exec nsenter --net={} {}",
        cg.enter(),
        netns.display(),
        up_args(lab, k, sock, extra).join(" ")
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]);
    output_within(cmd, START_LIMIT)
}

/// Starts `up` on node 1 in `cg` (by `ip netns exec`: the limit holds whether or not the
/// daemon sees it), with its stderr's lines.
fn spawn_in_cgroup(
    lab: &Lab,
    cg: &MemCgroup,
    sock: &Path,
    extra: &[&str],
) -> (std::process::Child, Lines) {
    let node1 = format!(
        "{} && exec ip netns exec {} {}",
        cg.enter(),
        lab.ns(1),
        up_args(lab, 1, sock, extra).join(" ")
    );
    let mut d1 = Command::new("sh")
        .args(["-c", &node1])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node 1");
    let log1 = Lines::new(d1.stderr.take().expect("stderr"));
    (d1, log1)
}

/// Whether `ipoib-cm status --json` on node 1 gets the daemon's status document from `sock`
/// within 10 s.
fn status_answers(lab: &Lab, sock: &Path) -> bool {
    let sock = sock.to_str().expect("utf-8 path");
    let out = output_within(
        lab.exec(1, &[BIN, "status", "--json", "--control-socket", sock]),
        Duration::from_secs(10),
    );
    out.status.success() && serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok()
}

/// The figure of the memory line: "the settings need N MiB".
fn memory_need_mib(stderr: &str) -> Option<u64> {
    stderr
        .split("the settings need ")
        .nth(1)?
        .split(" MiB")
        .next()?
        .parse()
        .ok()
}

#[test]
fn a_16_mb_memory_cgroup_ends_up_at_start_with_the_figure_never_an_oom_kill() {
    let Some((lab, cg)) = lab_and_cgroup("ipresm", 16 << 20) else {
        return;
    };
    let sock = socket("m");
    let out = up_in_cgroup(&lab, &cg, 1, &sock, &[]);
    let _ = std::fs::remove_file(&sock);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(cg.oom_kills(), 0, "{stderr}");
    assert_eq!(out.status.code(), Some(2), "{:?}: {stderr}", out.status);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: ipoib-cm up: memory: the settings need "),
        "{stderr}"
    );
    let need = memory_need_mib(&stderr).expect("the figure");
    assert!(need > 16, "{stderr}");
    assert!(
        stderr.contains("the cgroup allows 16 MiB (memory."),
        "{stderr}"
    );
    assert!(stderr.contains(&cg.dir.display().to_string()), "{stderr}");
    assert!(
        stderr.contains("lower --srq-depth or --rx-spare"),
        "{stderr}"
    );
}

#[test]
fn a_memory_cgroup_at_the_figure_carries_a_stream_both_ways() {
    let settings = ["--srq-depth", "64", "--rx-spare", "32"];
    // The figure, from a cgroup too small for it.
    let Some((lab, small)) = lab_cgroup_and_iperf3("ipresf") else {
        return;
    };
    let sock1 = socket("f1");
    let sock2 = socket("f2");
    let out = up_in_cgroup(&lab, &small, 1, &sock1, &settings);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let need = memory_need_mib(&stderr).unwrap_or_else(|| panic!("no figure: {stderr}"));
    let cg = MemCgroup::new(need << 20).expect("a second cgroup");
    // Node 1 in a cgroup of exactly that, node 2 beside it; `ip netns exec` for both (the
    // limit holds whether or not the daemon sees it).
    let (mut d1, mut log1) = spawn_in_cgroup(&lab, &cg, &sock1, &settings);
    let mut d2 = lab.spawn(2, &up_args(&lab, 2, &sock2, &settings));
    let mut log2 = Lines::new(d2.stderr.take().expect("stderr"));
    assert!(log1.wait_for("started", START_LIMIT), "{:?}", log1.seen());
    assert!(log2.wait_for("started", START_LIMIT), "{:?}", log2.seen());
    for (server, client, dst) in [(1, 2, "198.19.0.1"), (2, 1, "198.19.0.2")] {
        let mut srv = lab.exec(server, &["iperf3", "-s", "-1"]);
        srv.stdout(Stdio::null()).stderr(Stdio::null());
        let mut srv = srv.spawn().expect("iperf3 server");
        std::thread::sleep(Duration::from_millis(500));
        let out = output_within(
            lab.exec(client, &["iperf3", "-c", dst, "-t", "3", "-P", "4"]),
            Duration::from_secs(30),
        );
        let _ = srv.kill();
        let _ = srv.wait();
        assert!(
            out.status.success(),
            "iperf3 to {dst}: {}{}\nnode 1: {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            log1.seen()
        );
    }
    assert_eq!(cg.oom_kills(), 0);
    assert!(
        d1.try_wait().expect("node 1").is_none(),
        "{:?}",
        log1.seen()
    );
    assert!(status_answers(&lab, &sock1), "node 1's status");
    let _ = d1.kill();
    let _ = d2.kill();
    let _ = d1.wait();
    let _ = d2.wait();
    let _ = std::fs::remove_file(&sock1);
    let _ = std::fs::remove_file(&sock2);
    // The lab kills what is left before the cgroups go.
    drop(lab);
}

/// Four workers in a cgroup at the figure `up` names, sending to a peer that takes one
/// connection (a static neighbour whose hardware address lacks `0x10`, as Linux `ipoib_cm`'s
/// does): the followers hand every packet to control, whose one connection carries them, and
/// a broadcast flood goes through control too. What is handed over is bounded and in the
/// figure: no OOM kill, the daemon answers after (before the bound, this test's iperf3 failed).
#[test]
fn four_workers_at_the_figure_survive_handing_a_stream_and_a_flood_to_control() {
    let settings = ["--srq-depth", "64", "--rx-spare", "32"];
    let Some((lab, small)) = lab_cgroup_and_iperf3("ipresw") else {
        return;
    };
    let sock1 = socket("w1");
    let sock2 = socket("w2");
    let mut d2 = lab.spawn(2, &up_args(&lab, 2, &sock2, &settings));
    let mut log2 = Lines::new(d2.stderr.take().expect("stderr"));
    assert!(log2.wait_for("started", START_LIMIT), "{:?}", log2.seen());
    let hw = log2
        .seen()
        .iter()
        .find_map(|l| l.split("hwaddr=").nth(1))
        .and_then(|h| h.split_whitespace().next())
        .map(str::to_owned)
        .expect("node 2's hwaddr");
    let (_, rest) = hw.split_once(':').expect("hwaddr");
    let one_connection = format!("198.19.0.2=80:{rest}");
    let mut args: Vec<&str> = settings.to_vec();
    args.extend(["--workers", "4", "--neigh", &one_connection]);
    let out = up_in_cgroup(&lab, &small, 1, &sock1, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let need = memory_need_mib(&stderr).unwrap_or_else(|| panic!("no figure: {stderr}"));
    assert!(stderr.contains("handed between workers"), "{stderr}");
    let cg = MemCgroup::new(need << 20).expect("a second cgroup");
    let (mut d1, mut log1) = spawn_in_cgroup(&lab, &cg, &sock1, &args);
    assert!(log1.wait_for("started", START_LIMIT), "{:?}", log1.seen());
    let mut srv = lab.exec(2, &["iperf3", "-s", "-1"]);
    srv.stdout(Stdio::null()).stderr(Stdio::null());
    let mut srv = srv.spawn().expect("iperf3 server");
    std::thread::sleep(Duration::from_millis(500));
    let mut flood = lab.exec(
        1,
        &["ping", "-b", "-f", "-s", "60000", "-w", "4", "198.19.0.255"],
    );
    flood.stdout(Stdio::null()).stderr(Stdio::null());
    let mut flood = flood.spawn().expect("flood");
    let out = output_within(
        lab.exec(1, &["iperf3", "-c", "198.19.0.2", "-t", "4", "-P", "8"]),
        Duration::from_secs(30),
    );
    let _ = flood.wait();
    let _ = srv.kill();
    let _ = srv.wait();
    assert!(
        out.status.success(),
        "iperf3: {}{}\nnode 1: {:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        log1.seen()
    );
    assert_eq!(cg.oom_kills(), 0, "{:?}", log1.seen());
    assert!(
        d1.try_wait().expect("node 1").is_none(),
        "{:?}",
        log1.seen()
    );
    assert!(status_answers(&lab, &sock1), "node 1's status");
    println!("four workers at {need} MiB: iperf3 through one connection and a flood, no OOM kill");
    let _ = d1.kill();
    let _ = d2.kill();
    let _ = d1.wait();
    let _ = d2.wait();
    let _ = std::fs::remove_file(&sock1);
    let _ = std::fs::remove_file(&sock2);
    drop(lab);
}

/// `up` on node 1 of `lab` under `prlimit --nofile=N:N` (soft and hard: the raise cannot
/// help), `None` when `prlimit` is missing.
fn up_with_nofile(lab: &Lab, n: u64, sock: &Path) -> Option<std::process::Child> {
    up_with_nofile_of(lab, n, n, sock)
}

/// `up` on node 1 of `lab` under `prlimit --nofile=SOFT:HARD`.
fn up_with_nofile_of(lab: &Lab, soft: u64, hard: u64, sock: &Path) -> Option<std::process::Child> {
    if Command::new("prlimit").arg("--version").output().is_err() {
        return None;
    }
    let mut args = vec!["prlimit".to_owned(), format!("--nofile={soft}:{hard}")];
    args.extend(["ip", "netns", "exec", lab.ns(1)].map(str::to_owned));
    args.extend(up_args(lab, 1, sock, &[]));
    let mut cmd = Command::new(&args[0]);
    cmd.args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    Some(cmd.spawn().expect("prlimit"))
}

/// The figure of the descriptor line: "needs N".
fn descriptors_needed(stderr: &str) -> Option<u64> {
    stderr
        .split("file descriptors: needs ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// Waits for a daemon that should refuse to start; its stderr and exit code.
fn refused(child: std::process::Child) -> (String, Option<i32>) {
    let out = common::child::output_within(child, START_LIMIT);
    (
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

#[test]
fn rlimit_nofile_too_low_ends_up_at_start_with_one_line() {
    let lab = crate::lab_or_skip!("ipresn", 2, 1500);
    let sock = socket("n");
    for n in [10, 13, 16] {
        let Some(child) = up_with_nofile(&lab, n, &sock) else {
            println!("skipped: no prlimit");
            return;
        };
        let (stderr, code) = refused(child);
        assert_eq!(code, Some(2), "RLIMIT_NOFILE {n}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "RLIMIT_NOFILE {n}: {stderr}");
        assert!(
            stderr.starts_with("error: ipoib-cm up: file descriptors: needs "),
            "{stderr}"
        );
        assert!(
            stderr.trim_end().ends_with(&format!(
                ", RLIMIT_NOFILE allows {n} (ulimit -n / LimitNOFILE=)"
            )),
            "{stderr}"
        );
        assert!(
            descriptors_needed(&stderr).is_some_and(|need| need > n),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn a_low_soft_rlimit_nofile_is_raised_to_the_hard_limit() {
    let lab = crate::lab_or_skip!("ipresr", 2, 1500);
    let sock = socket("r");
    let Some(mut child) = up_with_nofile_of(&lab, 16, 4096, &sock) else {
        println!("skipped: no prlimit");
        return;
    };
    let mut log = Lines::new(child.stderr.take().expect("stderr"));
    let started = log.wait_for("started", START_LIMIT);
    let answers = started && status_answers(&lab, &sock);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&sock);
    let seen = log.finish(Duration::from_secs(2)).join("\n");
    assert!(started && answers, "{seen}");
    assert!(
        seen.contains("RLIMIT_NOFILE allows 4096 (raised from 16)"),
        "{seen}"
    );
}

#[test]
fn at_the_lowest_rlimit_nofile_it_starts_with_status_answers_12_of_12() {
    let lab = crate::lab_or_skip!("ipresl", 2, 1500);
    let sock = socket("l");
    let Some(child) = up_with_nofile(&lab, 16, &sock) else {
        println!("skipped: no prlimit");
        return;
    };
    let (stderr, _) = refused(child);
    let mut need = descriptors_needed(&stderr).unwrap_or_else(|| panic!("{stderr}"));
    // One below the figure it names is refused, the figure itself starts (an inherited
    // descriptor numbered between the two limits would raise the figure: ask again then).
    let (mut daemon, mut log) = (None, None);
    for _ in 0..3 {
        let (stderr, code) = refused(up_with_nofile(&lab, need - 1, &sock).expect("prlimit"));
        assert_eq!(code, Some(2), "RLIMIT_NOFILE {}: {stderr}", need - 1);
        let mut child = up_with_nofile(&lab, need, &sock).expect("prlimit");
        let mut lines = Lines::new(child.stderr.take().expect("stderr"));
        if lines.wait_for("started", START_LIMIT) {
            daemon = Some(child);
            log = Some(lines);
            break;
        }
        let _ = child.kill();
        let _ = child.wait();
        let again = lines.seen().join("\n");
        need = descriptors_needed(&again).unwrap_or_else(|| panic!("{again}"));
    }
    let (mut daemon, mut log) = (
        daemon.expect("never started at its own figure"),
        log.expect("log"),
    );
    let answered = std::thread::scope(|s| {
        let calls: Vec<_> = (0..12)
            .map(|_| s.spawn(|| status_answers(&lab, &sock)))
            .collect();
        calls
            .into_iter()
            .map(|c| c.join().expect("status thread"))
            .filter(|answered| *answered)
            .count()
    });
    // Room is left for every client slot: the descriptors open now and the 64 clients and
    // the one turned away fit under the limit.
    let open = std::fs::read_dir(format!("/proc/{}/fd", daemon.id()))
        .map(|d| d.count() as u64)
        .unwrap_or(0);
    let _ = daemon.kill();
    let _ = daemon.wait();
    let seen = log.finish(Duration::from_secs(2)).join("\n");
    let _ = std::fs::remove_file(&sock);
    assert_eq!(answered, 12, "RLIMIT_NOFILE {need}:\n{seen}");
    // Every client slot's descriptor and the one of a connection turned away.
    let room = open + ipoib_cm::daemon::control::MAX_CLIENTS as u64 + 1;
    assert!(open > 0 && room <= need, "{open} open, limit {need}");
    assert!(!seen.contains("Too many open files"), "{seen}");
    // Both figures and both limits in the start-up log.
    assert!(
        seen.contains("resources: memory: the settings need ")
            && seen.contains(&format!("file descriptors: need {need} ("))
            && seen.contains(&format!("RLIMIT_NOFILE allows {need}")),
        "{seen}"
    );
}
