//! The provider conformance suite (`verbs::conformance`) over the software provider: two
//! `SoftVerbs` nodes joined by the deterministic simulated fabric (`sim::Fabric`), one test
//! per check.

use std::time::{Duration, Instant};

use ipoib_cm::sim::Fabric;
use ipoib_cm::soft::{SoftConfig, SoftVerbs};
use ipoib_cm::verbs::conformance::{self, ConformancePair};
use ipoib_cm::verbs::{PathMtu, Verbs};

/// Two clean nodes with a 4096-byte port MTU.
fn pair() -> Fabric {
    Fabric::with_nodes(2, Instant::now(), |_, c| c.port_mtu = PathMtu::Mtu4096)
}

fn run(name: &str) {
    let mut f = pair();
    if let Err(e) = conformance::run_one(&mut f, name) {
        panic!("conformance check {name} failed: {e}");
    }
    // Nothing a check did may leave the fabric busy or leak a posted buffer.
    f.settle();
    let (a, b) = f.providers();
    assert_eq!(a.qp_count() + b.qp_count(), 0, "{name} left QPs behind");
    assert_eq!(
        (a.pools().posted_count(), b.pools().posted_count()),
        (0, 0),
        "{name} left buffers posted"
    );
}

macro_rules! checks {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run(stringify!($name));
            }
        )*

        #[test]
        fn every_check_has_a_test() {
            let listed = [$(stringify!($name)),*];
            let all: Vec<&str> = conformance::checks::<SoftVerbs, Fabric>()
                .iter()
                .map(|(n, _)| *n)
                .collect();
            assert_eq!(all, listed);
        }
    };
}

checks!(
    qp_state_machine,
    rc_message_sizes,
    completion_order,
    flush_on_err,
    drain_wr_after_err,
    srq_last_wqe_once,
    rnr_then_success,
    rnr_retry_exceeded,
    retry_exceeded_peer_gone,
    ud_grh_qkey,
    buffer_lending,
    comm_est,
    object_rules,
);

/// `run_all` over one pair: every check passes when run back to back on the same providers.
#[test]
fn run_all_on_one_pair() {
    let mut f = pair();
    let results = conformance::run_all(&mut f);
    for (name, r) in &results {
        println!(
            "{name}: {}",
            r.as_ref()
                .map_or_else(|e| e.to_string(), |()| "ok".to_owned())
        );
    }
    let failed: Vec<_> = results.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(failed.is_empty(), "{failed:?}");
}

/// The whole suite over IPv6 GIDs (the ICRC over the IPv6 pseudo-header, the IPv6 GRH).
#[test]
fn run_all_over_ipv6() {
    let configs = ["fd00::1", "fd00::2"]
        .iter()
        .map(|ip| {
            let mut c = SoftConfig::new(ip.parse().unwrap());
            c.port_mtu = PathMtu::Mtu4096;
            c
        })
        .collect();
    let mut f = Fabric::new(configs, Duration::from_micros(20), Instant::now());
    let failed: Vec<_> = conformance::run_all(&mut f)
        .into_iter()
        .filter(|(_, r)| r.is_err())
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    let (a, b) = f.providers();
    assert!(a.stats().rx_datagrams > 0 && b.stats().rx_bad_icrc == 0);
}
