//! Unit tests of the soft provider that need its internals; the behavioural tests run over
//! the simulated fabric in `tests/sim_rc.rs` and `tests/conformance_soft.rs`.

use std::time::{Duration, Instant};

use crate::sim::Fabric;
use crate::verbs::conformance::{self as cf, ConformancePair, RcParams, RecvTarget};
use crate::verbs::{Completion, PoolId, QpNum, Verbs};

/// A fresh two-node fabric with an endpoint on each node (`count` buffers of `buf_len` bytes,
/// CQs of `cq_depth` entries) and an RC pair from A to B at `params`: `(fabric, A's endpoint,
/// B's endpoint, A's QP, B's QP)`.
fn rc_pair(
    buf_len: usize,
    count: usize,
    cq_depth: u32,
    params: &RcParams,
) -> (Fabric, cf::Endpoint, cf::Endpoint, QpNum, QpNum) {
    let mut fab = Fabric::with_nodes(2, Instant::now(), |_, _| {});
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, buf_len, count, cq_depth).unwrap();
    let eb = cf::open_endpoint(b, buf_len, count, cq_depth).unwrap();
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, params).unwrap();
    (fab, ea, eb, qa, qb)
}

/// A busy QP cancels its retransmit timer whenever everything is acknowledged and re-arms it
/// with the next send. The timer heap must not keep an entry per cycle: one live entry per QP
/// timer (plus briefly a superseded one) is all there may be, however long the stream.
#[test]
fn timer_heap_stays_bounded_on_a_busy_qp() {
    let p = RcParams {
        timeout: 8, // 1 ms: many expiries of stale entries during the stream
        ..RcParams::default()
    };
    let (mut fab, ea, eb, qa, qb) = rc_pair(256, 4, 64, &p);
    let mut cs: Vec<Completion> = Vec::new();
    let mut most = 0;
    for i in 0..2000u64 {
        let (a, b) = fab.providers();
        cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, i, 1).unwrap();
        cf::post_send_data(a, qa, ea.pool, i, &[7; 100]).unwrap();
        let done = fab.run_until(100, Duration::from_secs(1), |f| {
            f.nodes[0].pools().posted_count() == 0
        });
        assert!(done, "message {i} did not complete");
        most = most.max(
            fab.nodes
                .iter()
                .map(|n| n.dev.sched.timer_entries())
                .max()
                .unwrap_or(0),
        );
        for (v, cq) in fab.nodes.iter_mut().zip([ea.send_cq, eb.recv_cq]) {
            cs.clear();
            cf::poll_into(v, cq, &mut cs);
            cf::free_bufs(v, &cs);
        }
    }
    assert!(most <= 2, "the timer heap grew to {most} entries");
    // Once idle, stale entries drain away.
    fab.run_idle(1000, Duration::from_secs(1));
    assert!(fab.nodes.iter().all(|n| n.dev.sched.timer_entries() == 0));
}

/// IPv4 datagrams whose ICRC fits an IP ID of 1..64 (later segments of a UDP GSO train) are
/// accepted as GSO segments; any other ID (a sender that picks its own, as rxe does) is solved
/// for, accepted, counted, and its peer handed out once; a corrupted byte is a bad ICRC.
#[test]
fn any_ipv4_id_is_accepted_and_corruption_is_not() {
    use crate::soft::{SoftConfig, SoftVerbs};
    use crate::wire::icrc::{append_icrc, IpHeaderInfo, Ipv4IdShift};
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    let local = Ipv4Addr::new(198, 18, 0, 2);
    let peer = Ipv4Addr::new(198, 18, 0, 1);
    let mut v = SoftVerbs::new(SoftConfig::new(IpAddr::V4(local)));
    let now = Instant::now();
    // RC SEND_ONLY to QPN 0x123456 (none exists): past the ICRC check it counts as unknown.
    let mut body = vec![0x04, 0, 0xFF, 0xFF, 0, 0x12, 0x34, 0x56, 0, 0, 0, 1];
    body.extend_from_slice(&[0xAB; 64]);
    let datagram = |id: u16| {
        let ip = IpHeaderInfo::V4 {
            src: peer,
            dst: local,
            identification: id,
            dont_fragment: true,
        };
        let mut d = body.clone();
        append_icrc(&ip, 4791, 4791, &mut d);
        d
    };
    let src = SocketAddr::new(IpAddr::V4(peer), 4791);
    for id in [0u16, 1, 7, 63] {
        v.handle_datagram(now, src, IpAddr::V4(local), &datagram(id));
    }
    assert_eq!(v.stats().rx_gso_segments, 3);
    assert_eq!(v.stats().rx_unknown_qpn, 4);
    assert_eq!(v.stats().rx_bad_icrc, 0);
    assert_eq!(v.take_id_solved_peers(), Vec::<IpAddr>::new());
    // rxe-style IDs: hashed, anywhere in the 16 bits.
    for id in [64u16, 1000, 0x8001, 0xFFFF] {
        v.handle_datagram(now, src, IpAddr::V4(local), &datagram(id));
    }
    assert_eq!(v.stats().rx_icrc_id_solved, 4);
    assert_eq!(v.stats().rx_unknown_qpn, 8);
    assert_eq!(v.take_id_solved_peers(), vec![IpAddr::V4(peer)]);
    v.handle_datagram(now, src, IpAddr::V4(local), &datagram(0x4242));
    assert!(
        v.take_id_solved_peers().is_empty(),
        "a peer is handed out once"
    );
    for id in [5u16, 0x4242] {
        let mut corrupt = datagram(id);
        corrupt[20] ^= 1;
        v.handle_datagram(now, src, IpAddr::V4(local), &corrupt);
    }
    assert_eq!(v.stats().rx_bad_icrc, 2);
    assert_eq!(v.stats().rx_gso_segments, 3);
    assert_eq!(v.stats().rx_icrc_id_solved, 5);
    assert_eq!(v.stats().icrc_id_peers_untracked, 0);
    assert_eq!(Ipv4IdShift::new(body.len() + 4).delta(0), 0);
}

/// Two nodes with RC pairs both ways (A to B, B to A) at `params`, buffers of `buf_len`
/// bytes, one receive posted on each receiving QP, and `b_first` posted by B to A before
/// anything else; then A's 64-byte request is delivered to B, which now owes its ACK.
struct Crossing {
    fab: Fabric,
    now: Instant,
    /// B's endpoint.
    eb: cf::Endpoint,
    /// B's QP sending to A.
    qb2: QpNum,
}

fn crossing_pairs(buf_len: usize, params: &RcParams, b_first: Option<&[u8]>) -> Crossing {
    use std::net::SocketAddr;

    let (mut fab, ea, eb, qa, qb) = rc_pair(buf_len, 8, 64, params);
    let now = fab.now();
    let (a, b) = fab.providers();
    let (qb2, qa2) = cf::connect_rc(b, &eb, a, &ea, params).unwrap();
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 1).unwrap();
    cf::post_recvs(a, RecvTarget::Qp(qa2), ea.pool, 0, 1).unwrap();
    if let Some(data) = b_first {
        cf::post_send_data(b, qb2, eb.pool, 2, data).unwrap();
    }
    cf::post_send_data(a, qa, ea.pool, 1, &[1; 64]).unwrap();
    let mut buf = Vec::new();
    let a_src = SocketAddr::new(a.config().local_ip, a.config().src_port);
    a.poll_transmit(now, &mut buf).expect("A sends its request");
    let b_ip = b.config().local_ip;
    b.handle_datagram(now, a_src, b_ip, &buf);
    Crossing { fab, now, eb, qb2 }
}

/// In one flush, requests leave before responses that were due first: B owes A the ACK of a
/// request when it posts a reply on its own QP to A, and the reply goes out ahead of the ACK
/// (so A wakes to both, not to the ACK alone while the reply waits behind it).
#[test]
fn requests_leave_before_pending_acks() {
    use crate::wire::bth::Opcode;

    let Crossing {
        mut fab,
        now,
        eb,
        qb2,
    } = crossing_pairs(256, &RcParams::default(), None);
    let (a, b) = fab.providers();
    assert!(a.poll_transmit(now, &mut Vec::new()).is_none());
    let mut buf = Vec::new();
    // B now owes an ACK on qb; the "reply" is posted after that.
    cf::post_send_data(b, qb2, eb.pool, 2, &[2; 64]).unwrap();
    let mut opcodes = Vec::new();
    for _ in 0..4 {
        buf.clear();
        if b.poll_transmit(now, &mut buf).is_none() {
            break;
        }
        opcodes.push(Opcode(buf[0]));
    }
    assert_eq!(
        opcodes,
        [Opcode::RC_SEND_ONLY, Opcode::RC_ACKNOWLEDGE],
        "the reply must leave first, then the ACK"
    );
}

/// The send window starts at rxe's 128 PSNs, widens to its maximum while nothing is lost,
/// halves when a loss makes the requester go back, keeps halving under repeated loss (below
/// where it started), and widens again once packets get through.
#[test]
fn send_window_grows_while_clean_halves_on_each_loss_and_recovers() {
    use crate::soft::qp::{WINDOW_MAX_PSNS, WINDOW_MIN_PSNS, WINDOW_START_PSNS};
    use crate::verbs::PathMtu;

    let p = RcParams {
        path_mtu: Some(PathMtu::Mtu256),
        ..RcParams::default()
    };
    let (mut fab, ea, eb, qa, qb) = rc_pair(65536, 64, 256, &p);
    let window = |fab: &Fabric| fab.nodes[0].qps.get(qa).map(|q| q.req.window);
    assert_eq!(window(&fab), Some(WINDOW_START_PSNS));
    let mut cs: Vec<Completion> = Vec::new();
    let mut send = |fab: &mut Fabric, first: u64, n: u64| {
        for i in first..first + n {
            let (a, b) = fab.providers();
            cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, i, 1).unwrap();
            cf::post_send_data(a, qa, ea.pool, i, &cf::pattern(i, 65536)).unwrap();
        }
        let done = fab.run_until(100_000, Duration::from_secs(10), |f| {
            f.nodes[0].pools().posted_count() == 0
        });
        assert!(done, "messages {first}.. did not complete");
        for (v, cq) in fab.nodes.iter_mut().zip([ea.send_cq, eb.recv_cq]) {
            cs.clear();
            cf::poll_into(v, cq, &mut cs);
            cf::free_bufs(v, &cs);
        }
    };
    // 16 messages of 256 packets: 4096 PSNs acknowledged, enough to reach the maximum.
    send(&mut fab, 0, 16);
    assert_eq!(window(&fab), Some(WINDOW_MAX_PSNS));
    // One message sent while A's packets vanish for `d`.
    let send_lost_for = |fab: &mut Fabric, id: u64, d: Duration| {
        fab.partitioned[0] = true;
        let (a, b) = fab.providers();
        cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, id, 1).unwrap();
        cf::post_send_data(a, qa, ea.pool, id, &[9; 1000]).unwrap();
        fab.transmit();
        fab.advance(d);
        fab.partitioned[0] = false;
    };
    // A's packets vanish for a while: the retransmit timeout halves the window.
    send_lost_for(&mut fab, 100, Duration::from_millis(100));
    assert_eq!(window(&fab), Some(WINDOW_MAX_PSNS / 2));
    fab.run_idle(10_000, Duration::from_secs(5));
    assert_eq!(
        fab.nodes[0].pools().posted_count(),
        0,
        "the resend got through"
    );
    // Timeouts in a row (67 ms backing off to 536 ms, starting from where the last episode
    // left off, since no RTT was measured after it): one halving each.
    let timeouts = |fab: &Fabric| fab.nodes[0].stats().retransmit_timeouts;
    let (before, w0) = (timeouts(&fab), window(&fab).unwrap());
    send_lost_for(&mut fab, 101, Duration::from_millis(2100));
    let n = timeouts(&fab) - before;
    assert!(n >= 4, "{n} timeouts");
    assert_eq!(window(&fab), Some((w0 >> n).max(WINDOW_MIN_PSNS)));
    assert!(window(&fab).unwrap() < WINDOW_START_PSNS);
    fab.run_idle(10_000, Duration::from_secs(5));
    // Traffic widens it again.
    send(&mut fab, 200, 16);
    assert!(
        window(&fab).unwrap() > WINDOW_START_PSNS,
        "{:?}",
        window(&fab)
    );
}

/// However wide the PSN window, at most 128 messages are in flight unacknowledged: a flood of
/// one-packet messages stops there until ACKs return (the receiver's posted receives are
/// what bounds it, not the PSN space).
#[test]
fn unacknowledged_messages_are_capped() {
    use crate::soft::qp::{MAX_UNACKED_MESSAGES, WINDOW_MAX_PSNS};

    let p = RcParams {
        max_send_wr: 512,
        max_recv_wr: 512,
        ..RcParams::default()
    };
    let (mut fab, ea, eb, qa, qb) = rc_pair(256, 512, 1024, &p);
    if let Some(q) = fab.nodes[0].qps.get_mut(qa) {
        q.req.window = WINDOW_MAX_PSNS;
    }
    let (a, b) = fab.providers();
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 200).unwrap();
    for i in 0..200 {
        cf::post_send_data(a, qa, ea.pool, i, &[1; 64]).unwrap();
    }
    let now = fab.now();
    let mut buf = Vec::new();
    let mut sent = 0;
    while sent < 1000 && fab.nodes[0].poll_transmit(now, &mut buf).is_some() {
        buf.clear();
        sent += 1;
    }
    assert_eq!(sent, MAX_UNACKED_MESSAGES);
}

/// A stream one way does not hold back the ACKs the other way: with a QP sending a long
/// message and another owing an ACK, the ACK leaves within the first
/// `REQUESTS_PER_RESPONSE` + 1 packets.
#[test]
fn a_stream_does_not_hold_back_acks() {
    use crate::verbs::PathMtu;

    let p = RcParams {
        path_mtu: Some(PathMtu::Mtu256),
        ..RcParams::default()
    };
    // B starts a 100-packet message to A, then receives A's request and owes its ACK.
    let Crossing { mut fab, now, .. } = crossing_pairs(65536, &p, Some(&[2; 25_600]));
    let b = &mut fab.nodes[1];
    let mut buf = Vec::new();
    let mut ack_at = None;
    for i in 0..40 {
        buf.clear();
        if b.poll_transmit(now, &mut buf).is_none() {
            break;
        }
        if crate::wire::bth::Opcode(buf[0]) == crate::wire::bth::Opcode::RC_ACKNOWLEDGE {
            ack_at = Some(i);
            break;
        }
    }
    assert_eq!(ack_at, Some(super::sched::REQUESTS_PER_RESPONSE as usize));
}

/// The QPN sequence is a permutation of the 24-bit space: every value once per 2^24 steps,
/// the same for the same seed, another order for another seed.
#[test]
fn qpn_sequence_is_a_keyed_permutation() {
    use super::objects::QpnSequence;
    let mut seen = vec![0u64; (1 << 24) / 64];
    let mut s = QpnSequence::new(7, crate::wire::WorkerId::SINGLE);
    for _ in 0..(1u32 << 24) {
        let v = s.next();
        assert!(v < 1 << 24);
        let (w, bit) = ((v / 64) as usize, v % 64);
        assert_eq!(seen[w] >> bit & 1, 0, "{v:#x} came twice");
        seen[w] |= 1 << bit;
    }
    let first = |seed| {
        let mut s = QpnSequence::new(seed, crate::wire::WorkerId::SINGLE);
        (0..4).map(|_| s.next()).collect::<Vec<_>>()
    };
    assert_eq!(first(7), first(7));
    assert_ne!(first(7), first(8));
}

/// A provider hands out QPNs in its seed's order, never 0, 1 or the multicast QPN and never
/// one in use; two seeds (two processes) share none of their first QPNs, and consecutive QPNs
/// are not consecutive numbers.
#[test]
fn qpns_follow_the_seed_and_skip_the_special_ones() {
    use super::MULTICAST_QPN;

    let qpns = |seed: u64, n: usize| {
        let (mut v, _, init) = lone_engine(|c| c.qpn_seed = seed);
        (0..n)
            .map(|_| v.create_qp(&init).unwrap())
            .collect::<Vec<QpNum>>()
    };
    let a = qpns(1, 64);
    let b = qpns(2, 64);
    assert_eq!(a, qpns(1, 64), "a fixed seed repeats");
    assert!(a.iter().all(|q| q.get() > 1 && *q != MULTICAST_QPN));
    assert!(a.iter().all(|q| !b.contains(q)), "{a:?} {b:?}");
    assert!(a.windows(2).all(|w| w[1].get() != w[0].get() + 1));
    let mut sorted = a.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), a.len());
}

/// The sequence of one worker of N is a permutation of that worker's share of the QPN space:
/// every value once per period (2^(24 - log2 N) steps), each with the worker's index in its
/// low bits; even and odd numbers of bits (the odd ones walk the network) alike.
#[test]
fn a_workers_qpn_sequence_is_a_permutation_of_its_share() {
    use super::objects::QpnSequence;
    use crate::wire::{WorkerCount, WorkerId};
    for (count, index) in [(2u32, 1u8), (8, 5), (64, 63)] {
        let count = WorkerCount::new(count).unwrap();
        let slot = WorkerId::new(index, count).unwrap();
        let mut s = QpnSequence::new(11, slot);
        let period = s.period();
        assert_eq!(period, 1 << (24 - count.bits()));
        let mut seen = vec![0u64; (period as usize).div_ceil(64)];
        for _ in 0..period {
            let v = s.next();
            assert!(v < 1 << 24, "{v:#x}");
            assert_eq!(count.owner(v), index, "{v:#x} is not worker {index}'s");
            let k = v >> count.bits();
            let (w, bit) = ((k / 64) as usize, k % 64);
            assert_eq!(seen[w] >> bit & 1, 0, "{v:#x} came twice in one period");
            seen[w] |= 1 << bit;
        }
    }
}

/// One worker's sequence is the one every release so far handed out: the same values as the
/// permutation on two 12-bit halves of a 24-bit counter, written out here as it was.
#[test]
fn one_workers_qpns_are_unchanged() {
    use super::objects::QpnSequence;
    fn splitmix(x: u64) -> u64 {
        let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    for seed in [0u64, 7, 0xDEAD_BEEF_0123_4567] {
        let mut k = seed;
        let keys: [u64; 4] = std::array::from_fn(|_| {
            k = splitmix(k);
            k
        });
        let mut counter = (splitmix(k) as u32) & 0x00FF_FFFF;
        let mut s = QpnSequence::new(seed, crate::wire::WorkerId::SINGLE);
        for _ in 0..4096 {
            let x = counter;
            counter = (counter + 1) & 0x00FF_FFFF;
            let (mut l, mut r) = (x >> 12, x & 0xFFF);
            for k in keys {
                let f = (splitmix(u64::from(r) ^ k) as u32) & 0xFFF;
                (l, r) = (r, l ^ f);
            }
            assert_eq!(s.next(), (l << 12) | r, "seed {seed}");
        }
    }
}

proptest::proptest! {
    /// A provider that is worker `index` of `count` allocates QPNs that all carry `index` in
    /// their low bits, never 0, 1 or the multicast QPN, never one twice; and with the same
    /// seed two workers' QPNs differ (their low bits do).
    #[test]
    fn a_workers_qpns_carry_its_index(
        seed in proptest::prelude::any::<u64>(),
        log2 in 0u32..=6,
        pick in proptest::prelude::any::<u8>(),
    ) {
        use crate::wire::{WorkerCount, WorkerId};
        let count = WorkerCount::new(1 << log2).unwrap();
        let index = pick % count.get();
        let slot = WorkerId::new(index, count).unwrap();
        let qpns = |slot: WorkerId| {
            let (mut v, _, init) = lone_engine(|c| {
                c.qpn_seed = seed;
                c.workers = slot;
            });
            (0..64).map(|_| v.create_qp(&init).unwrap()).collect::<Vec<QpNum>>()
        };
        let mine = qpns(slot);
        for q in &mine {
            proptest::prop_assert_eq!(count.owner_of_qpn(*q), index, "{:#x}", q.get());
            proptest::prop_assert!(q.get() > 1 && *q != super::MULTICAST_QPN);
        }
        let mut sorted = mine.clone();
        sorted.sort();
        sorted.dedup();
        proptest::prop_assert_eq!(sorted.len(), mine.len());
        if count.get() > 1 {
            let other = WorkerId::new((index + 1) % count.get(), count).unwrap();
            let theirs = qpns(other);
            proptest::prop_assert!(mine.iter().all(|q| !theirs.contains(q)));
        }
    }
}

/// An engine on 198.18.0.1 (its configuration adjusted by `adjust`) with a PD and a CQ, and
/// the `QpInit` of a 1-deep RC QP on them.
fn lone_engine(
    adjust: impl FnOnce(&mut super::SoftConfig),
) -> (super::SoftVerbs, crate::verbs::PdId, crate::verbs::QpInit) {
    use crate::verbs::{QpInit, QpType};
    let mut cfg = super::SoftConfig::new(std::net::IpAddr::from([198, 18, 0, 1]));
    adjust(&mut cfg);
    let mut v = super::SoftVerbs::new(cfg);
    let pd = v.alloc_pd().unwrap();
    let cq = v.create_cq(4).unwrap();
    let init = QpInit {
        pd,
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        max_send_wr: 1,
        max_recv_wr: 1,
        sq_sig_all: false,
    };
    (v, pd, init)
}

/// `--qpn-seed 0` fixes the QPN order, so a daemon's hardware address can be named in a static
/// `--neigh` in advance: its first QPN (with the CM over UDP, the UD QP's) is pinned here.
#[test]
fn the_first_qpn_of_seed_0_is_fixed() {
    use super::objects::QpnSequence;
    let first = std::iter::repeat_with({
        let mut s = QpnSequence::new(0, crate::wire::WorkerId::SINGLE);
        move || s.next()
    })
    .find(|&q| q > 1 && q != super::MULTICAST_QPN.get())
    .unwrap();
    assert_eq!(first, 0x98_5220, "{first:#08x}");
}

/// `verify_icrc_v4` off (`--no-icrc-v4`) checks no IPv4 ICRC at all, solves nothing and logs
/// nothing; IPv6 ICRCs are still checked exactly (IPv6 has no ID to solve for).
#[test]
fn no_icrc_v4_checks_nothing_on_ipv4_and_ipv6_stays_exact() {
    use crate::soft::{SoftConfig, SoftVerbs};
    use crate::wire::icrc::{append_icrc, IpHeaderInfo};
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    let local = Ipv4Addr::new(198, 18, 0, 2);
    let peer = Ipv4Addr::new(198, 18, 0, 1);
    let mut cfg = SoftConfig::new(IpAddr::V4(local));
    cfg.verify_icrc_v4 = false;
    let mut v = SoftVerbs::new(cfg);
    let now = Instant::now();
    let mut body = vec![0x04, 0, 0xFF, 0xFF, 0, 0x12, 0x34, 0x56, 0, 0, 0, 1];
    body.extend_from_slice(&[0xAB; 64]);
    let ip = IpHeaderInfo::V4 {
        src: peer,
        dst: local,
        identification: 0x4242,
        dont_fragment: true,
    };
    let mut d = body.clone();
    append_icrc(&ip, 4791, 4791, &mut d);
    let src = SocketAddr::new(IpAddr::V4(peer), 4791);
    v.handle_datagram(now, src, IpAddr::V4(local), &d);
    d[20] ^= 1;
    v.handle_datagram(now, src, IpAddr::V4(local), &d);
    assert_eq!(v.stats().rx_bad_icrc, 0);
    assert_eq!(v.stats().rx_icrc_id_solved, 0);
    assert_eq!(v.stats().rx_unknown_qpn, 2);
    assert!(v.take_id_solved_peers().is_empty());

    let (l6, p6): (Ipv6Addr, Ipv6Addr) = (
        "2001:db8::2".parse().unwrap(),
        "2001:db8::1".parse().unwrap(),
    );
    let mut cfg = SoftConfig::new(IpAddr::V6(l6));
    cfg.verify_icrc_v4 = false;
    let mut v = SoftVerbs::new(cfg);
    let mut d = body.clone();
    append_icrc(&IpHeaderInfo::V6 { src: p6, dst: l6 }, 4791, 4791, &mut d);
    let src = SocketAddr::new(IpAddr::V6(p6), 4791);
    v.handle_datagram(now, src, IpAddr::V6(l6), &d);
    d[20] ^= 1;
    v.handle_datagram(now, src, IpAddr::V6(l6), &d);
    assert_eq!(v.stats().rx_unknown_qpn, 1);
    assert_eq!(v.stats().rx_bad_icrc, 1);
}

/// The injected fatal event: `DeviceFatal` is raised, every verb that can fail fails with
/// `DeviceLost` and nothing more is sent or received; the reopened engine has no objects,
/// works, and continues the counters.
#[test]
fn a_lost_device_fails_every_verb_until_reopened() {
    use crate::verbs::{AsyncEvent, SendWr, VerbsError, WrId};
    let (mut fab, ea, _eb, qa, _qb) = rc_pair(256, 4, 64, &RcParams::default());
    let v = &mut fab.nodes[0];
    let sent = v.stats().tx_packets;
    v.raise_port_event(AsyncEvent::PortActive);
    v.fail_device();
    assert!(v.is_lost());
    assert_eq!(v.poll_async_event(), Some(AsyncEvent::DeviceFatal));
    assert_eq!(v.poll_async_event(), None, "what was queued before is gone");
    let buf = v.pools_mut().alloc(ea.pool).unwrap();
    assert_eq!(
        v.post_send(qa, &SendWr::send(WrId(1), buf, 10)),
        Err(VerbsError::DeviceLost)
    );
    assert_eq!(v.alloc_pd(), Err(VerbsError::DeviceLost));
    assert_eq!(v.create_cq(16), Err(VerbsError::DeviceLost));
    let mut cs = Vec::new();
    assert_eq!(v.poll_cq(ea.send_cq, &mut cs, 16), 0);
    let now = Instant::now();
    let mut out = Vec::new();
    assert_eq!(v.poll_transmit(now, &mut out), None);
    assert_eq!(v.poll_timeout(), None);
    let peer = fab.nodes[1].peer_addr(fab.nodes[1].port_attr().gid);
    fab.nodes[0].handle_datagram(now, peer, peer.ip(), &[0; 64]);
    assert_eq!(fab.nodes[0].stats().rx_device_lost, 1);

    let mut v = fab.nodes[0].reopened(7);
    assert!(!v.is_lost());
    assert_eq!(v.qp_count(), 0);
    assert!(v.alloc_pd().is_ok());
    assert_eq!(v.stats().tx_packets, sent, "counters carry over");
    assert_eq!(v.stats().rx_device_lost, 1);
}

/// `device_fatal_after` loses the device that long after the first timer turn, once.
#[test]
fn the_fatal_knob_fires_once_after_its_delay() {
    use crate::soft::{SoftConfig, SoftVerbs};
    use crate::verbs::AsyncEvent;
    let mut cfg = SoftConfig::new("198.18.0.1".parse().unwrap());
    cfg.faults.device_fatal_after = Some(Duration::from_secs(1));
    let mut v = SoftVerbs::new(cfg);
    let t0 = Instant::now();
    v.handle_timeout(t0);
    assert_eq!(v.poll_timeout(), Some(t0 + Duration::from_secs(1)));
    v.handle_timeout(t0 + Duration::from_millis(999));
    assert!(!v.is_lost());
    v.handle_timeout(t0 + Duration::from_secs(1));
    assert!(v.is_lost());
    assert_eq!(v.poll_async_event(), Some(AsyncEvent::DeviceFatal));
    let mut v = v.reopened(1);
    v.handle_timeout(t0 + Duration::from_secs(5));
    assert!(!v.is_lost(), "a reopened device is not armed again");
    assert_eq!(v.poll_timeout(), None);
}

/// Under `moves_later`, moves begun are made `MOVES_LATER_BY` after the engine's time, or at
/// once by a verb on their QP; moves begun before the engine knew the time (no timer call
/// yet) count from its first timer call. A destroyed QP's moves have no result.
#[test]
fn moves_later_wait_for_the_engines_time() {
    use super::{Quirks, MOVES_LATER_BY};
    use crate::verbs::setup::rc_init_attr;
    use crate::verbs::{Moves, QpState};

    let (mut v, pd, init) = lone_engine(|c| {
        c.quirks = Quirks {
            moves_later: true,
            ..Quirks::default()
        }
    });
    let [a, b, c] = [(); 3].map(|()| v.create_qp(&init).unwrap());
    assert_eq!(v.begin_moves(a, &[rc_init_attr()]), Ok(Moves::Started));
    assert_eq!(
        v.poll_timeout(),
        None,
        "the engine does not know the time yet"
    );
    let t0 = Instant::now();
    v.handle_timeout(t0);
    assert_eq!(v.poll_timeout(), Some(t0 + MOVES_LATER_BY));
    assert_eq!(v.poll_moved(), None);
    assert_eq!(v.query_qp_state(a), Ok(QpState::Reset), "not made yet");
    assert_eq!(v.begin_moves(b, &[rc_init_attr()]), Ok(Moves::Started));
    assert_eq!(v.begin_moves(c, &[rc_init_attr()]), Ok(Moves::Started));
    v.destroy_qp(c).unwrap();
    let pool = v.create_pool(pd, 64, 1).unwrap();
    // A verb on `b` makes its moves first.
    let rb = v.pools_mut().alloc(pool).unwrap();
    assert_eq!(v.post_recv(b, crate::verbs::WrId(1), rb), Ok(()));
    v.handle_timeout(t0 + MOVES_LATER_BY);
    let done: Vec<_> = std::iter::from_fn(|| v.poll_moved())
        .map(|m| (m.qp, m.result))
        .collect();
    assert_eq!(done, vec![(b, Ok(())), (a, Ok(()))]);
    assert_eq!(v.query_qp_state(a), Ok(QpState::Init));
    let s = v.stats();
    assert_eq!((s.moves_started, s.moves_settled), (3, 1));
}

/// Everything `from` sends at `now`, as `(datagram, PSN)`.
fn drain_wire(fab: &mut Fabric, from: usize, now: Instant) -> Vec<(Vec<u8>, u32)> {
    let mut out = Vec::new();
    for _ in 0..10_000 {
        let mut buf = Vec::new();
        if fab.nodes[from].poll_transmit(now, &mut buf).is_none() {
            break;
        }
        let psn = crate::wire::roce::RocePacket::parse(&buf).unwrap().bth.psn;
        out.push((buf, psn));
    }
    out
}

/// Hands `datagram` from node `from` to node `to` at `now`.
fn deliver(fab: &mut Fabric, from: usize, to: usize, now: Instant, datagram: &[u8]) {
    let c = *fab.nodes[from].config();
    let src = std::net::SocketAddr::new(c.local_ip, c.src_port);
    let dst = fab.nodes[to].config().local_ip;
    fab.nodes[to].handle_datagram(now, src, dst, datagram);
}

/// A NAK for a PSN that the go-back-N begun less than an RTT ago resends already answers a
/// packet sent before it: it starts no second go-back-N (each packet is resent once). The
/// responder here drops what arrives out of sequence, as rxe does: a packet overtaken by the
/// next one draws a NAK for it, and the one that overtook it, dropped, draws a second NAK
/// once the first arrives.
#[test]
fn a_nak_for_a_psn_being_resent_starts_no_second_go_back() {
    let p = RcParams::default();
    let mut fab = Fabric::with_nodes(2, Instant::now(), |_, c| c.reorder_hold_packets = 0);
    let (a, b) = fab.providers();
    let ea = cf::open_endpoint(a, 256, 32, 64).unwrap();
    let eb = cf::open_endpoint(b, 256, 32, 64).unwrap();
    let (qa, qb) = cf::connect_rc(a, &ea, b, &eb, &p).unwrap();
    cf::post_recvs(b, RecvTarget::Qp(qb), eb.pool, 0, 16).unwrap();
    let ms = Duration::from_millis(1);
    // One message measures the RTT: 1 ms.
    let t0 = fab.now();
    cf::post_send_data(&mut fab.nodes[0], qa, ea.pool, 0, &[1; 64]).unwrap();
    for (d, _) in drain_wire(&mut fab, 0, t0) {
        deliver(&mut fab, 0, 1, t0, &d);
    }
    for (d, _) in drain_wire(&mut fab, 1, t0) {
        deliver(&mut fab, 1, 0, t0 + ms, &d);
    }
    // Eight one-packet messages; the third is overtaken by the fourth.
    let t1 = t0 + 2 * ms;
    for i in 1..=8 {
        cf::post_send_data(&mut fab.nodes[0], qa, ea.pool, i, &[1; 64]).unwrap();
    }
    let sent = drain_wire(&mut fab, 0, t1);
    assert_eq!(sent.len(), 8);
    let order = [0, 1, 3, 2, 4, 5, 6, 7];
    for k in order {
        deliver(&mut fab, 0, 1, t1, &sent[k].0);
    }
    let responses = drain_wire(&mut fab, 1, t1);
    let naks: Vec<u32> = responses.iter().map(|r| r.1).collect();
    let first = sent[0].1;
    assert!(
        naks.contains(&(first + 2)) && naks.contains(&(first + 3)),
        "NAKs for the overtaken and the dropped packet: {naks:?} (first PSN {first})"
    );
    // The first NAK makes A go back to the third packet; the second, for the fourth, comes
    // while that go-back-N is resending it.
    for (d, _) in &responses {
        deliver(&mut fab, 1, 0, t1 + ms / 2, d);
        drain_wire(&mut fab, 0, t1 + ms / 2);
    }
    let s = fab.nodes[0].stats();
    assert_eq!(s.tx_retransmits, 6, "packets 3..8 resent once: {s:?}");
    assert_eq!(s.naks_ignored_in_recovery, 1, "{s:?}");
    assert_eq!(s.window_shrinks, 1, "{s:?}");
}

/// Eight one-packet messages from A (node 0, `qa`, send buffers of `pool`) to B, work
/// requests `first..first + 8`, sent at `t`: B gets the first, second and fourth at `t`, and,
/// at `late` (or never), the third and the rest. Returns what B sent back at `t`.
fn reordered_round(
    fab: &mut Fabric,
    qa: QpNum,
    pool: PoolId,
    first: u64,
    t: Instant,
    late: Option<Instant>,
) -> Vec<(Vec<u8>, u32)> {
    for i in first..first + 8 {
        cf::post_send_data(&mut fab.nodes[0], qa, pool, i, &[1; 64]).unwrap();
    }
    let sent = drain_wire(fab, 0, t);
    assert_eq!(sent.len(), 8);
    for k in [0, 1, 3] {
        deliver(fab, 0, 1, t, &sent[k].0);
    }
    let early = drain_wire(fab, 1, t);
    if let Some(late) = late {
        for k in [2, 4, 5, 6, 7] {
            deliver(fab, 0, 1, late, &sent[k].0);
        }
    }
    early
}

/// B learns that the path from A reorders: a [`reordered_round`] of work requests
/// `first..first + 8` at `t` whose third packet comes 2 ms late, NAKed at once and dropped
/// past it (as rxe does); A's resend of the third, 5 ms after the NAK, shows the NAK was
/// spurious (the first copy came at 2 ms), and B's NAK wait becomes 2.5 ms. Everything is
/// delivered, in order.
fn learn_reordering(fab: &mut Fabric, qa: QpNum, pool: PoolId, first: u64, t: Instant) {
    let ms = Duration::from_millis(1);
    let early = reordered_round(fab, qa, pool, first, t, Some(t + 2 * ms));
    let late_acks = drain_wire(fab, 1, t + 2 * ms);
    for (d, _) in &early {
        deliver(fab, 1, 0, t + ms, d);
    }
    // A goes back on the NAK and resends packets 3..8: B sees the third twice.
    let resent = drain_wire(fab, 0, t + ms);
    assert_eq!(resent.len(), 6);
    for (d, _) in &resent {
        deliver(fab, 0, 1, t + 5 * ms, d);
    }
    for (d, _) in &late_acks {
        deliver(fab, 1, 0, t + 3 * ms, d);
    }
    for (d, _) in drain_wire(fab, 1, t + 5 * ms) {
        deliver(fab, 1, 0, t + 6 * ms, &d);
    }
}

/// A responder starts as rxe: a request that arrives ahead of its predecessor is dropped and
/// the gap NAKed at once. The requester's resend of the late request, well after the late
/// request itself, then shows that NAK spurious, and from then on the QP holds what arrives
/// ahead and lets a gap stay open a quarter longer than that one took to fill before it
/// NAKs: a reordering like it costs nothing, and a loss is NAKed when the wait runs out.
#[test]
fn a_responder_learns_the_path_reorders_then_holds_early_requests() {
    let p = RcParams::default();
    let (mut fab, ea, eb, qa, qb) = rc_pair(256, 32, 64, &p);
    cf::post_recvs(&mut fab.nodes[1], RecvTarget::Qp(qb), eb.pool, 0, 24).unwrap();
    let ms = Duration::from_millis(1);
    let b_stats = |fab: &Fabric| fab.nodes[1].stats();
    let t1 = fab.now();
    learn_reordering(&mut fab, qa, ea.pool, 0, t1);
    let s = b_stats(&fab);
    // The fourth packet dropped and NAKed, then the fifth once the third filled the gap.
    assert_eq!(
        (s.rx_held, s.rx_held_delivered, s.tx_seq_naks),
        (0, 0, 2),
        "{s:?}"
    );
    assert_eq!((s.naks_spurious, s.nak_wait_us), (1, 2500), "{s:?}");
    // The same reordering again: held, no NAK, nothing resent.
    let t2 = t1 + 10 * ms;
    assert!(
        reordered_round(&mut fab, qa, ea.pool, 8, t2, Some(t2 + 2 * ms))
            .iter()
            .all(|(d, _)| {
                crate::wire::roce::RocePacket::parse(d).is_ok_and(|p| {
                    p.aeth.is_some_and(|a| {
                        a.syndrome == crate::wire::ext::Syndrome::Ack { credits: 0x1F }
                    })
                })
            })
    );
    fab.nodes[1].handle_timeout(t2 + 3 * ms);
    let s = b_stats(&fab);
    assert_eq!((s.rx_held, s.rx_held_delivered, s.tx_seq_naks), (1, 1, 2));
    assert_eq!(s.rx_held_now, 0);
    // A loss: the third never comes, and the gap is NAKed when the wait runs out.
    let t3 = t1 + 20 * ms;
    reordered_round(&mut fab, qa, ea.pool, 16, t3, None);
    fab.nodes[1].handle_timeout(t3 + 2 * ms);
    assert_eq!(b_stats(&fab).tx_seq_naks, 2);
    fab.nodes[1].handle_timeout(t3 + 3 * ms);
    let naks = drain_wire(&mut fab, 1, t3 + 3 * ms);
    assert_eq!(b_stats(&fab).tx_seq_naks, 3, "{naks:?}");
    assert_eq!(b_stats(&fab).rx_held_now, 1);
    // Everything B took came in order, once.
    let mut cs = Vec::new();
    cf::poll_into(&mut fab.nodes[1], eb.recv_cq, &mut cs);
    let ids: Vec<u64> = cs.iter().map(|c| c.wr_id.0).collect();
    assert_eq!(ids, (0..18).collect::<Vec<_>>());
}

/// `datagram` from node 0 to node 1 made again with `opcode` and `payload` (a forgery from
/// the peer's address and port, with a valid ICRC).
fn forged(
    fab: &Fabric,
    datagram: &[u8],
    opcode: crate::wire::bth::Opcode,
    payload: &[u8],
) -> Vec<u8> {
    let mut bth = crate::wire::roce::RocePacket::parse(datagram).unwrap().bth;
    bth.opcode = opcode;
    let (a, b) = (fab.nodes[0].config(), fab.nodes[1].config());
    let ip = super::device::ip_info(a.local_ip, b.local_ip).unwrap();
    super::reorder::request_datagram(bth, &ip, (a.src_port, b.dst_port), payload)
}

/// What a responder holds came early, so a blind sender that guessed a PSN ahead may have
/// made it up: one that does not follow the message in progress when its turn comes is
/// dropped (an invalid request in sequence would break the connection), and two different
/// copies of one PSN are both dropped. The peer's own copy, sent again, is taken.
#[test]
fn made_up_requests_held_ahead_never_break_the_connection() {
    use crate::verbs::QpState;
    use crate::wire::bth::Opcode;

    let (mut fab, ea, eb, qa, qb) = rc_pair(256, 32, 64, &RcParams::default());
    cf::post_recvs(&mut fab.nodes[1], RecvTarget::Qp(qb), eb.pool, 0, 16).unwrap();
    // Only a QP whose path was seen to reorder holds anything.
    let t0 = fab.now();
    learn_reordering(&mut fab, qa, ea.pool, 100, t0);
    let now = t0 + Duration::from_millis(10);
    for i in 0..6u8 {
        cf::post_send_data(&mut fab.nodes[0], qa, ea.pool, u64::from(i), &[i; 64]).unwrap();
    }
    let sent = drain_wire(&mut fab, 0, now);
    assert_eq!(sent.len(), 6);
    // A SEND_MIDDLE made up for the third PSN, held, and dropped when its turn comes.
    deliver(&mut fab, 0, 1, now, &sent[0].0);
    let middle = forged(&fab, &sent[2].0, Opcode::RC_SEND_MIDDLE, &[0xEE; 64]);
    deliver(&mut fab, 0, 1, now, &middle);
    deliver(&mut fab, 0, 1, now, &sent[1].0);
    let s = fab.nodes[1].stats();
    assert_eq!((s.rx_held, s.rx_held_invalid), (1, 1), "{s:?}");
    assert_eq!(fab.nodes[1].query_qp_state(qb).unwrap(), QpState::Rts);
    // A made-up SEND_ONLY for the sixth PSN, then the peer's own: both dropped.
    deliver(&mut fab, 0, 1, now, &sent[2].0);
    deliver(&mut fab, 0, 1, now, &sent[3].0);
    let only = forged(&fab, &sent[5].0, Opcode::RC_SEND_ONLY, &[0xEE; 64]);
    deliver(&mut fab, 0, 1, now, &only);
    deliver(&mut fab, 0, 1, now, &sent[5].0);
    assert_eq!(fab.nodes[1].stats().rx_hold_conflicts, 1);
    assert_eq!(fab.nodes[1].stats().rx_held_now, 0);
    // The rest in order, the sixth sent again: everything the peer sent, and only that.
    deliver(&mut fab, 0, 1, now, &sent[4].0);
    deliver(&mut fab, 0, 1, now, &sent[5].0);
    let mut cs = Vec::new();
    cf::poll_into(&mut fab.nodes[1], eb.recv_cq, &mut cs);
    // The first eight receives took the round that taught B the path reorders.
    let got: Vec<(u64, u8)> = cs
        .iter()
        .skip(8)
        .map(|c| {
            (
                c.wr_id.0,
                fab.nodes[1].pools().get(c.buf.unwrap()).unwrap()[0],
            )
        })
        .collect();
    assert_eq!(got, (0..6).map(|i| (8 + i, i as u8)).collect::<Vec<_>>());
    assert_eq!(fab.nodes[1].query_qp_state(qb).unwrap(), QpState::Rts);
}
