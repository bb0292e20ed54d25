//! A lab of `ipoib-cm up` daemons in network namespaces, built and torn down by
//! `scripts/lab.sh` (or, on a simulated InfiniBand fabric with its SM, `scripts/ib-lab.sh`):
//! real TUN interfaces, real UDP underlay, real `ping` and `iperf3`.
//!
//! Each [`Lab`] has its own namespace prefix and state directory and is torn down on drop,
//! also on failure; without root [`Lab::up`] prints `skipped: ...` and returns `None`. Every
//! wait is bounded.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");

/// A lab made by `scripts/lab.sh`.
pub(crate) struct Lab {
    /// Namespace prefix: node K is namespace `<prefix>K`.
    pub(crate) prefix: String,
    /// The state directory (logs, pid files, control sockets).
    pub(crate) state: PathBuf,
    /// The script that builds it (`scripts/lab.sh` or `scripts/ib-lab.sh`).
    script: &'static str,
}

fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name)
}

/// Ok when this process may build a lab (root, `ip`, the lab script), or why not.
pub(crate) fn can_run() -> Result<(), String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err("needs root to create network namespaces".into());
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Err("no /dev/net/tun".into());
    }
    Ok(())
}

impl Lab {
    pub(crate) fn up(prefix: &str, n: usize, args: &[&str]) -> Option<Self> {
        Self::up_with("lab.sh", prefix, n, args)
    }

    /// A lab on a simulated InfiniBand fabric (`scripts/ib-lab.sh`: ibsim, opensm, the
    /// daemons on its ports); `None` (skipped, said) without root.
    pub(crate) fn up_ib(prefix: &str, n: usize, args: &[&str]) -> Option<Self> {
        Self::up_with("ib-lab.sh", prefix, n, args)
    }

    fn up_with(script: &'static str, prefix: &str, n: usize, args: &[&str]) -> Option<Self> {
        if let Err(why) = can_run() {
            println!("skipped: {why}");
            return None;
        }
        let lab = Self {
            prefix: prefix.to_string(),
            state: std::env::temp_dir().join(format!("ipoib-cm-{prefix}-{}", std::process::id())),
            script,
        };
        // A lab left behind by a crashed run of this test.
        let _ = lab.sh(&["down"]);
        let mut a = vec!["up".to_string(), n.to_string(), "--".to_string()];
        a.extend(args.iter().map(|s| (*s).to_string()));
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        let out = lab.sh(&refs);
        assert!(
            out.status.success(),
            "lab up failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(lab)
    }

    pub(crate) fn sh(&self, args: &[&str]) -> Output {
        let mut c = Command::new("bash");
        c.arg(script(self.script))
            .args(args)
            .env("LAB_PREFIX", &self.prefix)
            .env("LAB_STATE", &self.state)
            .env("IPOIB_CM_BIN", BIN);
        run_within(c, Duration::from_secs(60))
    }

    pub(crate) fn exec(&self, k: usize, cmd: &[&str], limit: Duration) -> Output {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("{}{k}", self.prefix)])
            .args(cmd);
        run_within(c, limit)
    }

    pub(crate) fn ping(&self, from: usize, to: &str, extra: &[&str]) -> Output {
        let mut args = vec!["ping", "-n", "-c", "2", "-i", "0.2", "-W", "3"];
        args.extend_from_slice(extra);
        args.push(to);
        self.exec(from, &args, Duration::from_secs(20))
    }

    pub(crate) fn ping_ok(&self, from: usize, to: &str, extra: &[&str]) {
        let out = self.ping(from, to, extra);
        assert!(
            out.status.success(),
            "ping {to} {extra:?} from node {from}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            self.log(from)
        );
    }

    /// Runs `iperf3 -c DST ARGS -J` on node `from` against a one-shot server on node `to`,
    /// asserts it succeeded and returns its JSON report; `None` when iperf3 cannot be started
    /// (not installed).
    pub(crate) fn iperf3(
        &self,
        from: usize,
        to: usize,
        dst: &str,
        args: &[&str],
    ) -> Option<serde_json::Value> {
        let installed = Command::new("iperf3")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !installed {
            return None;
        }
        let mut server = Command::new("ip")
            .args(["netns", "exec", &format!("{}{to}", self.prefix)])
            .args(["iperf3", "-s", "-1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        std::thread::sleep(Duration::from_millis(500));
        let mut cmd = vec!["iperf3", "-c", dst];
        cmd.extend_from_slice(args);
        cmd.push("-J");
        let out = self.exec(from, &cmd, Duration::from_secs(30));
        let _ = server.kill();
        let _ = server.wait();
        assert!(
            out.status.success(),
            "iperf3: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(serde_json::from_slice(&out.stdout).expect("iperf3 JSON"))
    }

    /// Starts `ping -c COUNT -i 0.1 -W 2` from node `from` to `to` (bounded by 30 s); its
    /// replies are read with [`ping_received`].
    pub(crate) fn start_ping(&self, from: usize, to: &str, count: u32) -> std::process::Child {
        Command::new("ip")
            .args(["netns", "exec", &format!("{}{from}", self.prefix)])
            .args(["timeout", "30", "ping", "-n", "-i", "0.1", "-W", "2", "-c"])
            .arg(count.to_string())
            .arg(to)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("ping")
    }

    pub(crate) fn status(&self, k: usize) -> serde_json::Value {
        let out = self.sh(&["status", &k.to_string()]);
        assert!(
            out.status.success(),
            "status {k}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    pub(crate) fn counter(&self, k: usize, name: &str) -> u64 {
        self.status(k)["counters"][name].as_u64().expect("counter")
    }

    pub(crate) fn provider_counter(&self, k: usize, name: &str) -> u64 {
        self.status(k)["provider"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("no provider counter {name}"))
    }

    /// Node `k`'s control socket.
    pub(crate) fn socket(&self, k: usize) -> PathBuf {
        self.state.join(format!("node{k}.sock"))
    }

    pub(crate) fn log(&self, k: usize) -> String {
        std::fs::read_to_string(self.state.join(format!("node{k}.log"))).unwrap_or_default()
    }

    /// Polls `cond` every 100 ms until it holds or `limit` passes; returns whether it held.
    pub(crate) fn wait_for(&self, limit: Duration, mut cond: impl FnMut(&Self) -> bool) -> bool {
        let end = Instant::now() + limit;
        while Instant::now() < end {
            if cond(self) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        cond(self)
    }
}

/// Replies a finished [`Lab::start_ping`] got (from its "N received" summary; 0 if there is
/// none).
pub(crate) fn ping_received(child: std::process::Child) -> u32 {
    let out = child.wait_with_output().expect("ping output");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(',')
        .find_map(|part| part.trim().strip_suffix(" received"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A provider counter of a status (0 when it has none).
pub(crate) fn provider_of(status: &serde_json::Value, name: &str) -> u64 {
    status["provider"][name].as_u64().unwrap_or(0)
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self.sh(&["down"]);
    }
}

pub(crate) fn run_within(mut c: Command, limit: Duration) -> Output {
    c.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().expect("spawn");
    let end = Instant::now() + limit;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > end {
            let _ = child.kill();
            return child.wait_with_output().expect("output");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
