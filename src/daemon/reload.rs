//! A configuration reload (SIGHUP, `ipoib-cm reload`): which settings of a newly read
//! [`Config`] the running daemon takes ([`plan`], pure). The log filter changes through
//! [`logging::set_filter`](super::logging::set_filter).
//!
//! Live: the static neighbours, the peers, the timeouts, the budgets, `busy_poll` and the log
//! filter (when the process installed a hook). Everything else (the interface, its addresses,
//! the provider and its sockets, the mode, the path MTU, the workers...) is fixed at start: a
//! file that changes any of it is refused whole, naming what, and nothing of it is applied
//! (a half-applied file would leave the running daemon matching neither the old file nor the
//! new one).

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::config::Config;
use crate::wire::ipoib::HwAddr;

/// What a reload takes of a new configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ReloadPlan {
    /// The configuration to run with: the new one, with every setting that cannot change
    /// live kept as it was.
    pub next: Config,
    /// The live settings that changed (their config keys).
    pub changed: Vec<&'static str>,
    /// The settings that changed in the file but cannot change live (their config keys).
    pub fixed: Vec<&'static str>,
}

/// The static neighbours to remove and to add (or re-point) to go from `old` to `new`, in
/// their lists' orders; O(n log n), so that a reload of thousands of neighbours costs the
/// loop next to nothing when few change.
pub fn neighbour_changes(
    old: &[(IpAddr, HwAddr)],
    new: &[(IpAddr, HwAddr)],
) -> (Vec<IpAddr>, Vec<(IpAddr, HwAddr)>) {
    let old_map: BTreeMap<IpAddr, HwAddr> = old.iter().copied().collect();
    let new_map: BTreeMap<IpAddr, HwAddr> = new.iter().copied().collect();
    let removed = old
        .iter()
        .filter(|(ip, _)| !new_map.contains_key(ip))
        .map(|(ip, _)| *ip)
        .collect();
    let added = new
        .iter()
        .filter(|(ip, hw)| old_map.get(ip) != Some(hw))
        .copied()
        .collect();
    (removed, added)
}

/// What a reload from `running` to `new` does. `sized_qp` is the QP budget the endpoint was
/// created with: a larger one cannot apply live. `log_live` says whether the log filter can
/// change. Pure.
pub fn plan(running: &Config, new: &Config, sized_qp: u32, log_live: bool) -> ReloadPlan {
    let mut next = new.clone();
    let mut changed = Vec::new();
    let mut fixed = Vec::new();
    macro_rules! fixed {
        ($($field:ident => $key:literal),* $(,)?) => {$(
            if running.$field != new.$field {
                fixed.push($key);
                next.$field = running.$field.clone();
            }
        )*};
    }
    macro_rules! live {
        ($($field:ident => $key:literal),* $(,)?) => {$(
            if running.$field != new.$field {
                changed.push($key);
            }
        )*};
    }
    fixed!(
        ifname => "ifname",
        addr => "addr",
        bind => "bind",
        udp_port => "udp_port",
        cm_transport => "cm_transport",
        mad_port => "mad_port",
        rdma_cm_port => "rdma_cm_port",
        verify_icrc_v4 => "no_icrc_v4",
        udp_offload => "no_udp_offload",
        qp_timeout => "qp_timeout",
        reorder_hold => "reorder_hold",
        mode => "mode",
        srq => "no_srq",
        srq_depth => "srq_depth",
        rx_spare => "rx_spare",
        tx_rnr_retry => "tx_rnr_retry",
        tx_retry_count => "tx_retry_count",
        path_mtu => "path_mtu",
        fault => "fault_*",
        quirks => "quirk",
        fault_tun_rate => "fault_tun_rate",
        fault_worker => "fault_worker",
        control_socket => "control_socket",
        metrics_listen => "metrics_listen",
        provider => "provider",
        ib_dev => "ib_dev",
        ud_source_check => "ud_source_check",
        pin_peer_neighbours => "pin_peer_neighbours",
        pkey => "pkey",
        multicast => "no_multicast",
        multicast_ttl => "multicast_ttl",
        link_layer => "link_layer",
        workers => "workers",
        neigh_max => "neigh_max",
        max_pending_rx => "max_pending_rx",
        log_format => "log_format",
        qpn_seed => "qpn_seed",
    );
    if new.max_conn_qp > sized_qp {
        if running.max_conn_qp != new.max_conn_qp {
            fixed.push("max_conn_qp");
        }
        next.max_conn_qp = running.max_conn_qp;
    }
    if !log_live {
        fixed!(log => "log");
    }
    live!(
        peer => "peer",
        neigh => "neigh",
        rx_timeout => "rx_timeout",
        drain_timeout => "drain_timeout",
        tx_stall_timeout => "tx_stall_timeout",
        busy_poll => "busy_poll",
        neigh_timeout => "neigh_timeout",
        tx_queue_len => "tx_queue_len",
        qp_budget_policy => "qp_budget_policy",
    );
    if next.max_conn_qp != running.max_conn_qp {
        changed.push("max_conn_qp");
    }
    if log_live && running.log != new.log {
        changed.push("log");
    }
    ReloadPlan {
        next,
        changed,
        fixed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::config::{resolve_str, Settings};
    use std::path::Path;
    use std::time::Duration;

    const BASE: &str = r#"
        bind = "198.18.0.1"
        addr = ["198.19.0.1/24"]
        peer = ["198.18.0.2"]
        neigh = ["198.19.0.2=80:00:00:48:fe:80:00:00:00:00:00:00:00:00:00:00:c6:12:00:02"]
    "#;

    fn cfg(extra: &str) -> Config {
        resolve_str(
            Path::new("test.toml"),
            &format!("{BASE}\n{extra}"),
            &Settings::default(),
        )
        .unwrap()
    }

    #[test]
    fn an_unchanged_file_changes_nothing() {
        let c = cfg("");
        let p = plan(&c, &c, 128, true);
        assert!(p.changed.is_empty() && p.fixed.is_empty(), "{p:?}");
        assert_eq!(p.next, c);
    }

    #[test]
    fn live_settings_apply_and_fixed_ones_are_named_and_kept() {
        let running = cfg("");
        let new = resolve_str(
            Path::new("test.toml"),
            r#"
            bind = "198.18.0.9"
            ifname = "ib7"
            addr = ["198.19.0.1/24", "198.19.1.1/24"]
            mode = "datagram"
            peer = ["198.18.0.2", "198.18.0.3"]
            neigh = []
            rx_timeout = "5s"
            tx_queue_len = 9
            max_conn_qp = 64
            log = "debug"
            "#,
            &Settings::default(),
        )
        .unwrap();
        let p = plan(&running, &new, 128, true);
        assert_eq!(
            p.fixed,
            ["ifname", "addr", "bind", "mode", "control_socket"],
            "the default control socket follows ifname"
        );
        assert_eq!(
            p.changed,
            [
                "peer",
                "neigh",
                "rx_timeout",
                "tx_queue_len",
                "max_conn_qp",
                "log"
            ]
        );
        assert_eq!(p.next.ifname, running.ifname);
        assert_eq!(p.next.addr, running.addr);
        assert_eq!(p.next.bind, running.bind);
        assert_eq!(p.next.mode, running.mode);
        assert_eq!(p.next.peer.len(), 2);
        assert!(p.next.neigh.is_empty());
        assert_eq!(p.next.rx_timeout, Duration::from_secs(5));
        assert_eq!((p.next.tx_queue_len, p.next.max_conn_qp), (9, 64));
        assert_eq!(p.next.log, "debug");
    }

    /// What a start fixes for good (the threads, the port's link layer, the tables' sizes)
    /// is named: the reload is refused.
    #[test]
    fn workers_and_the_link_layer_are_fixed() {
        let running = cfg("");
        let new = cfg("workers = 2\nlink_layer = \"infiniband\"\nneigh_max = 64\npkey = 0x8001");
        let p = plan(&running, &new, 128, true);
        assert_eq!(p.fixed, ["pkey", "link_layer", "workers", "neigh_max"]);
        assert!(p.changed.is_empty());
        assert_eq!(p.next, running);
    }

    #[test]
    fn a_budget_above_the_sized_one_and_a_log_without_hook_are_fixed() {
        let running = cfg("");
        let new = cfg("max_conn_qp = 512\nlog = \"debug\"");
        let p = plan(&running, &new, 128, false);
        assert_eq!(p.fixed, ["max_conn_qp", "log"]);
        assert!(p.changed.is_empty());
        assert_eq!(p.next.max_conn_qp, running.max_conn_qp);
        assert_eq!(p.next.log, running.log);
    }

    #[test]
    fn neighbour_changes_remove_add_and_repoint() {
        let hw = |q: u8| {
            format!("80:00:00:{q:02x}:fe:80:00:00:00:00:00:00:00:00:00:00:c6:12:00:02")
                .parse::<HwAddr>()
                .unwrap()
        };
        let ip = |k: u8| IpAddr::from([198, 19, 0, k]);
        let old = [(ip(2), hw(1)), (ip(3), hw(1)), (ip(4), hw(1))];
        let new = [(ip(3), hw(1)), (ip(4), hw(2)), (ip(5), hw(3))];
        let (removed, added) = neighbour_changes(&old, &new);
        assert_eq!(removed, [ip(2)]);
        assert_eq!(added, [(ip(4), hw(2)), (ip(5), hw(3))]);
    }
}
