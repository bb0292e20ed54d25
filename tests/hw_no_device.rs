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

/// Without `/dev/infiniband/rdma_cm` the kernel's CM cannot be opened: one line naming the
/// flag and librdmacm's reason, exit 2 (and `up` says no RDMA device first where there is no
/// device at all).
#[test]
fn cm_transport_rdmacm_without_rdma_cm_says_so_in_one_line() {
    if std::path::Path::new("/dev/infiniband/rdma_cm").exists() {
        return;
    }
    let addr: std::net::SocketAddr = "127.0.0.1:4793".parse().unwrap();
    let e = ipoib_cm::driver::KernelCmDriver::open(addr, 8).unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    let node = ipoib_cm::NodeError::RdmaCm {
        addr,
        message: e.to_string(),
    };
    let line = ipoib_cm::daemon::run::DaemonError::from(node).to_string();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(line.starts_with("--cm-transport rdmacm"), "{line}");
    assert!(line.contains("no RDMA CM"), "{line}");
    if no_rdma() {
        let out = Command::new(env!("CARGO_BIN_EXE_ipoib-cm"))
            .args(["up", "--provider", "verbs", "--cm-transport", "rdmacm"])
            .output()
            .expect("run ipoib-cm");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
