//! The provider conformance suite (`verbs::conformance`) over the software provider: two
//! `SoftVerbs` nodes joined by the deterministic simulated fabric (`sim::Fabric`), one test
//! per check.

use std::time::{Duration, Instant};

use ipoib_cm::sim::Fabric;
use ipoib_cm::soft::{Quirks, SoftConfig, SoftVerbs};
use ipoib_cm::verbs::conformance::{
    self, Behaviours, CommEst, ConformancePair, Expecting, LastWqe, RecvInErr,
};
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
    destroy_keeps_srq,
    srq_recv_chain,
    rnr_then_success,
    rnr_retry_exceeded,
    retry_exceeded_peer_gone,
    ud_grh_qkey,
    buffer_lending,
    comm_est,
    object_rules,
    retire_drained,
    begin_moves,
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

/// A pair with `quirks` (4096-byte MTUs).
fn quirky_pair(quirks: Quirks) -> Fabric {
    Fabric::with_nodes(2, Instant::now(), |_, c| {
        c.port_mtu = PathMtu::Mtu4096;
        c.quirks = quirks;
    })
}

/// Runs `name` on a fresh pair with `quirks`, holding it to `expected`.
fn run_expecting(quirks: Quirks, name: &str, expected: Behaviours) -> Result<(), String> {
    let mut f = quirky_pair(quirks);
    let mut p = Expecting {
        pair: &mut f,
        expected,
    };
    conformance::run_one(&mut p, name).map_err(|e| e.to_string())
}

/// A provider is held to its described behaviours both ways: one that does what its
/// description says passes, and fails held to the contract; one that does better than its
/// description (a kernel whose rxe got fixed) fails too.
#[test]
fn described_behaviours_are_held_both_ways() {
    let spec = Behaviours::SPEC;
    let no_last_wqe = Quirks {
        no_last_wqe: true,
        ..Quirks::default()
    };
    let again = Quirks {
        last_wqe_again: true,
        ..Quirks::default()
    };
    let never = Behaviours {
        last_wqe: LastWqe::Never,
        ..spec
    };
    let on_re_err = Behaviours {
        last_wqe: LastWqe::AgainOnReErr,
        ..spec
    };
    let srq = "srq_last_wqe_once";
    // Described: passes.
    run_expecting(no_last_wqe, srq, never).unwrap();
    run_expecting(again, srq, on_re_err).unwrap();
    // Held to the contract: fails, saying what it saw.
    let e = run_expecting(again, srq, spec).unwrap_err();
    assert!(
        e.contains("second move to ERR raised QpLastWqeReached 1 times, expected 0"),
        "{e}"
    );
    let e = run_expecting(no_last_wqe, srq, spec).unwrap_err();
    assert!(
        e.contains("QpLastWqeReached raised 0 times on the move to ERR, expected 1"),
        "{e}"
    );
    // A clean provider described as a worse one: fails.
    let clean = Quirks::default();
    assert!(run_expecting(clean, srq, never).is_err());
    let e = run_expecting(clean, srq, on_re_err).unwrap_err();
    assert!(
        e.contains("second move to ERR raised QpLastWqeReached 0 times, expected 1"),
        "{e}"
    );
    let e = run_expecting(
        clean,
        "comm_est",
        Behaviours {
            comm_est: CommEst::Never,
            ..spec
        },
    )
    .unwrap_err();
    assert!(e.contains("CommEst raised 1 times, expected 0"), "{e}");
    let e = run_expecting(
        clean,
        "drain_wr_after_err",
        Behaviours {
            recv_in_err: RecvInErr::NeverCompleted,
            ..spec
        },
    )
    .unwrap_err();
    assert!(e.contains("receive posted in ERR"), "{e}");
    // A racy provider's row takes either outcome: a flushing one passes it.
    run_expecting(
        clean,
        "drain_wr_after_err",
        Behaviours {
            recv_in_err: RecvInErr::FlushedOrNever,
            ..spec
        },
    )
    .unwrap();
    // And the contract is what a pair is held to unless told otherwise.
    assert_eq!(pair().expected(), spec);
}

/// mlx5's destroy, which cleans the QP's completions from its CQs and gives their SRQ WQEs
/// back to the SRQ, keeps the SRQ whole too: [`WATCHDOG_DESTROYS`] destroys with a receive
/// queued leave its posted count where it started.
///
/// [`WATCHDOG_DESTROYS`]: ipoib_cm::verbs::conformance::WATCHDOG_DESTROYS
#[test]
fn destroy_keeps_srq_when_the_cq_is_cleaned() {
    let quirks = Quirks {
        clean_cq_on_destroy: true,
        ..Quirks::default()
    };
    run_expecting(quirks, "destroy_keeps_srq", Behaviours::SPEC).unwrap();
}

/// The suite retires only drained QPs: the software provider, which checks what a retired QP
/// still had outstanding, counts [`RETIRE_ROUNDS`] on each side and none undrained.
///
/// [`RETIRE_ROUNDS`]: ipoib_cm::verbs::conformance::RETIRE_ROUNDS
#[test]
fn retire_drained_retires_only_drained_qps() {
    let mut f = pair();
    conformance::run_one(&mut f, "retire_drained").unwrap();
    let (a, b) = f.providers();
    for s in [a.stats(), b.stats()] {
        assert_eq!(
            (s.qps_retired, s.retired_undrained),
            (conformance::RETIRE_ROUNDS as u64, 0)
        );
    }
}

/// The provider's check catches a caller that retires a QP with work outstanding.
#[test]
fn retiring_a_qp_with_a_send_outstanding_is_counted() {
    use ipoib_cm::verbs::conformance::{connect_rc, open_endpoint, post_send_data, RcParams};
    let mut f = pair();
    let (a, b) = f.providers();
    let ea = open_endpoint(a, 2048, 8, 64).unwrap();
    let eb = open_endpoint(b, 2048, 8, 64).unwrap();
    let (qa, qb) = connect_rc(a, &ea, b, &eb, &RcParams::default()).unwrap();
    post_send_data(a, qa, ea.pool, 1, &[7; 100]).unwrap();
    a.retire_qp(qa).unwrap();
    b.retire_qp(qb).unwrap();
    assert_eq!(
        (a.stats().retired_undrained, b.stats().retired_undrained),
        (1, 0)
    );
}

/// With the moves done later (`moves_later`, as the verbs provider's command thread does
/// them), `begin_moves` starts every connection's moves ([`MOVES_ROUNDS`] a side, plus the
/// moves to ERR), a `post_recv` right after waits for its QP's, and the whole suite still
/// passes (its other checks move QPs with `modify_qp`).
///
/// [`MOVES_ROUNDS`]: ipoib_cm::verbs::conformance::MOVES_ROUNDS
#[test]
fn begin_moves_with_the_moves_done_later() {
    let quirks = Quirks {
        moves_later: true,
        ..Quirks::default()
    };
    run_expecting(quirks, "begin_moves", Behaviours::SPEC).unwrap();
    let mut f = quirky_pair(quirks);
    let failed: Vec<_> = conformance::run_all(&mut f)
        .into_iter()
        .filter(|(_, r)| r.is_err())
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    let (a, b) = f.providers();
    let rounds = conformance::MOVES_ROUNDS as u64;
    for s in [a.stats(), b.stats()] {
        // Each round's moves to RTS and to ERR, and the refused ones (b) or the destroyed
        // ones (a).
        assert!(s.moves_started > 2 * rounds, "{s:?}");
        assert_eq!(s.retired_undrained, 0, "{s:?}");
    }
    // b's receive posted right after its moves began, every round.
    assert_eq!(b.stats().moves_settled, rounds);
}
