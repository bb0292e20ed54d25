//! Without an RDMA device (CI), `--provider verbs` fails with one clear line and exit 2.
#![cfg(feature = "verbs")]

use std::process::Command;

fn no_rdma() -> bool {
    !std::path::Path::new("/sys/class/infiniband_verbs").exists()
}

#[test]
fn provider_verbs_without_device_exits_2_with_one_line() {
    if !no_rdma() {
        return;
    }
    for args in [
        &["rc-pingpong", "--provider", "verbs"][..],
        &["up", "--provider", "verbs"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ipoib-cm"))
            .args(args)
            .output()
            .expect("run ipoib-cm");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("no RDMA device: "), "{args:?}: {err}");
    }
}
