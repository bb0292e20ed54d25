//! What an operator meets first, end to end: `up` without the privilege it needs, or on a host
//! without a TUN device, says so,
//! `rc-pingpong --deadline` (a duration) bounds the server's wait for a client, and
//! `scripts/lab.sh` logs a killed daemon's exit status.
//!
//! Each test builds its own namespaces (prefix `ipops`, 198.18.0.0/24) and removes them;
//! without root they print `skipped: ...` and pass.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::netns::output_within;

const BIN: &str = env!("CARGO_BIN_EXE_ipoib-cm");

/// Runs `args` in node 1 of `lab` as user nobody (uid and gid 65534, no groups).
fn as_nobody(lab: &common::netns::Lab, args: &[&str]) -> Command {
    let mut cmd = vec![
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    cmd.extend_from_slice(args);
    lab.exec(1, &cmd)
}

#[test]
fn up_without_cap_net_admin_says_root_or_cap_net_admin_is_needed() {
    let lab = crate::lab_or_skip!("ipopsu", 2, 1500);
    if Command::new("setpriv").arg("--version").output().is_err() {
        println!("skipped: no setpriv");
        return;
    }
    // The binary must be reachable by nobody (a checkout under a private home is not).
    let probe = output_within(
        as_nobody(&lab, &[BIN, "--version"]),
        Duration::from_secs(10),
    );
    if !probe.status.success() {
        println!(
            "skipped: user nobody cannot run {BIN}: {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        );
        return;
    }
    let sock = std::env::temp_dir().join(format!("ipops-{}.sock", std::process::id()));
    let out = output_within(
        as_nobody(
            &lab,
            &[
                BIN,
                "up",
                "--bind",
                "198.18.0.1",
                "--ifname",
                "ipops0",
                "--control-socket",
                sock.to_str().unwrap(),
            ],
        ),
        Duration::from_secs(20),
    );
    let _ = std::fs::remove_file(&sock);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(
            "error: ipoib-cm up: needs root or CAP_NET_ADMIN to create interface ipops0"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("--ifname"), "{stderr}");
}

#[test]
fn up_without_a_tun_device_says_so() {
    let lab = crate::lab_or_skip!("ipopst", 2, 1500);
    let sock = std::env::temp_dir().join(format!("ipops-t-{}.sock", std::process::id()));
    // A private mount namespace whose /dev/net is empty.
    let script = format!(
        "mount -t tmpfs none /dev/net && exec {BIN} up --bind 198.18.0.1 --ifname ipops1 \
         --control-socket {}",
        sock.display()
    );
    let out = output_within(
        lab.exec(1, &["unshare", "--mount", "sh", "-c", &script]),
        Duration::from_secs(20),
    );
    let _ = std::fs::remove_file(&sock);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("mount:") || stderr.contains("unshare:") {
        println!("skipped: cannot hide /dev/net here: {stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "error: ipoib-cm up: no TUN device: /dev/net/tun does not exist (load the module: modprobe \
         tun; in a container, pass the device in)"
    );
}

/// `rc-pingpong` server on node 1 with `--deadline`, no client: its exit and how long it took.
fn lonely_server(lab: &common::netns::Lab, deadline: &str) -> (std::process::Output, Duration) {
    let start = Instant::now();
    let out = output_within(
        lab.exec(1, &[BIN, "rc-pingpong", "--deadline", deadline]),
        Duration::from_secs(30),
    );
    (out, start.elapsed())
}

#[test]
fn rc_pingpong_deadline_bounds_the_servers_wait_for_a_client() {
    let lab = crate::lab_or_skip!("ipopsd", 2, 1500);
    for (deadline, at_least) in [
        ("1500ms", Duration::from_millis(1500)),
        ("2s", Duration::from_secs(2)),
        ("1", Duration::from_secs(1)),
    ] {
        let (out, took) = lonely_server(&lab, deadline);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "--deadline {deadline}: {stderr}"
        );
        assert!(
            stderr.contains("no client before the deadline"),
            "--deadline {deadline}: {stderr}"
        );
        // Generous: the bound is that it ends, not how precisely.
        assert!(
            took >= at_least && took < at_least + Duration::from_secs(10),
            "--deadline {deadline} took {took:?}"
        );
    }
    let (out, _) = lonely_server(&lab, "2x");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: ipoib-cm rc-pingpong: --deadline: "),
        "{stderr}"
    );
}

#[test]
fn lab_logs_a_killed_daemons_exit_status() {
    let Some(lab) = common::lab::Lab::up("ipopsk", 2, &[]) else {
        return;
    };
    let out = lab.sh(&["kill", "1"]);
    assert!(out.status.success(), "{out:?}");
    let logged = lab.wait_for(Duration::from_secs(10), |l| {
        l.log(1).contains("ipoib-cm exited with status 137")
    });
    assert!(logged, "node 1's log:\n{}", lab.log(1));
}
