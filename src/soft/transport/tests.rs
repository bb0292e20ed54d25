//! Tests of the UDP transport and its send batches, over loopback sockets.

use super::*;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

const V4: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const V6: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);

/// Receives one datagram, waiting up to a second for it to arrive.
fn recv_within(t: &UdpTransport, buf: &mut [u8]) -> RecvMeta {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        if let Some(meta) = t.recv(buf).unwrap() {
            return meta;
        }
        assert!(Instant::now() < deadline, "no datagram within 1 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn ping_pong(ip: IpAddr) {
    let a = UdpTransport::bind(SocketAddr::new(ip, 0)).unwrap();
    let b = UdpTransport::bind(SocketAddr::new(ip, 0)).unwrap();
    assert_eq!(a.local_addr().ip(), ip);
    assert_ne!(a.local_addr().port(), 0);
    let mut buf = [0u8; 2048];

    // Empty queue: Ok(None), not an error.
    assert_eq!(a.recv(&mut buf).unwrap(), None);

    assert!(a.send_to(b"ping", b.local_addr()).unwrap());
    let meta = recv_within(&b, &mut buf);
    assert_eq!(&buf[..meta.len], b"ping");
    assert_eq!(meta.src, a.local_addr());
    assert_eq!(meta.dst_ip, ip);

    let big = vec![0xa5u8; 1500];
    assert!(b.send_to(&big, a.local_addr()).unwrap());
    let meta = recv_within(&a, &mut buf);
    assert_eq!(&buf[..meta.len], &big[..]);
    assert_eq!(meta.src, b.local_addr());
    assert_eq!(meta.dst_ip, ip);

    assert_eq!(a.recv(&mut buf).unwrap(), None);
    assert_eq!(b.recv(&mut buf).unwrap(), None);
}

#[test]
fn ipv4_loopback_both_ways() {
    ping_pong(V4);
}

#[test]
fn ipv6_loopback_both_ways() {
    match UdpTransport::bind(SocketAddr::new(V6, 0)) {
        Ok(_) => ping_pong(V6),
        Err(e) => println!("skipped: cannot bind [::1]:0 ({e}); no IPv6 loopback"),
    }
}

#[test]
fn refuses_wildcard_addresses() {
    for ip in [
        IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    ] {
        let err = UdpTransport::bind(SocketAddr::new(ip, 4791)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{ip}");
    }
}

#[test]
fn socket_options_are_set() {
    let t = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    assert_eq!(
        sockopt::pmtudisc(&t.sock, false).unwrap(),
        libc::IP_PMTUDISC_DO
    );
    assert!(t.sock.nonblocking().unwrap());
    // close-on-exec shows up in the octal `flags:` line of /proc/self/fdinfo.
    let fdinfo =
        std::fs::read_to_string(format!("/proc/self/fdinfo/{}", t.sock.as_raw_fd())).unwrap();
    let flags = fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .map(|f| i64::from_str_radix(f.trim(), 8).unwrap())
        .unwrap();
    assert_ne!(flags & i64::from(libc::O_CLOEXEC), 0, "{fdinfo}");
    assert!(t.sock.recv_buffer_size().unwrap() > 0);
}

#[test]
fn oversized_datagram_is_dropped_not_truncated() {
    let a = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let b = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    assert!(a.send_to(&[7u8; 100], b.local_addr()).unwrap());
    assert!(a.send_to(&[8u8; 10], b.local_addr()).unwrap());
    let mut small = [0u8; 16];
    let meta = recv_within(&b, &mut small);
    assert_eq!(&small[..meta.len], &[8u8; 10]);
    assert_eq!(b.truncated_drops(), 1);
}

#[test]
fn send_errors_surface_unchanged() {
    // One byte over the largest IPv4 UDP payload (65507). Loopback's MTU is 65536, so DF
    // itself cannot be exercised here; the netns test checks DF on the wire.
    let a = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let err = a
        .send_to(&vec![0u8; 65_508], SocketAddr::new(V4, 9))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EMSGSIZE), "{err}");
}

/// Receives one batch, waiting up to a second for something to arrive.
fn recv_batch_within(t: &UdpTransport, batch: &mut RecvBatch) -> usize {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let n = t.recv_batch(batch).unwrap();
        if n > 0 {
            return n;
        }
        assert!(Instant::now() < deadline, "no datagram within 1 s");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn batch_both_ways(ip: IpAddr) {
    let a = UdpTransport::bind(SocketAddr::new(ip, 0)).unwrap();
    let b = UdpTransport::bind(SocketAddr::new(ip, 0)).unwrap();
    let mut rx = RecvBatch::new(8, 2048);
    assert_eq!(b.recv_batch(&mut rx).unwrap(), 0);

    // 12 datagrams through a 5-slot send batch, one of them too long for the receiver.
    let mut tx = TxBatch::new(5, 64);
    let mut sent = 0u8;
    let mut expect = Vec::new();
    while sent < 12 {
        while sent < 12
            && tx.push_appending(|buf| {
                buf.clear();
                let len = if sent == 3 {
                    3000
                } else {
                    10 + usize::from(sent)
                };
                buf.resize(len, sent);
                Some(b.local_addr())
            })
        {
            if sent != 3 {
                expect.push(sent);
            }
            sent += 1;
        }
        assert!(tx.queued() > 0);
        assert!(a.send_batch(&mut tx, None).unwrap());
        assert!(tx.is_empty());
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1);
    while got.len() < expect.len() {
        assert!(Instant::now() < deadline, "got only {got:?}");
        let n = recv_batch_within(&b, &mut rx);
        assert!(n <= 8);
        for i in 0..n {
            if let Some((meta, d)) = b.datagram(&rx, i) {
                assert_eq!(meta.src, a.local_addr());
                assert_eq!(meta.dst_ip, ip);
                assert_eq!(d.len(), meta.len);
                assert_eq!(d.len(), 10 + usize::from(d[0]));
                assert!(d.iter().all(|&x| x == d[0]));
                got.push(d[0]);
            }
        }
    }
    assert_eq!(got, expect);
    assert_eq!(b.truncated_drops(), 1);
    assert_eq!(b.recv_batch(&mut rx).unwrap(), 0);
}

#[test]
fn batches_ipv4() {
    batch_both_ways(V4);
}

#[test]
fn batches_ipv6() {
    match UdpTransport::bind(SocketAddr::new(V6, 0)) {
        Ok(_) => batch_both_ways(V6),
        Err(e) => println!("skipped: cannot bind [::1]:0 ({e}); no IPv6 loopback"),
    }
}

#[test]
fn batch_send_error_drops_only_that_datagram() {
    let a = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let b = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let mut tx = TxBatch::new(4, 16);
    for len in [5usize, 65_508, 6] {
        assert!(tx.push_appending(|buf| {
            buf.clear();
            buf.resize(len, 1);
            Some(b.local_addr())
        }));
    }
    let err = a.send_batch(&mut tx, None).unwrap_err();
    assert_eq!(err.error.raw_os_error(), Some(libc::EMSGSIZE), "{err}");
    assert!(err.too_big && !err.gso_off, "{err:?}");
    assert_eq!(tx.queued(), 1);
    assert!(a.send_batch(&mut tx, None).unwrap());
    let mut rx = RecvBatch::new(4, 128);
    let mut lens = Vec::new();
    while lens.len() < 2 {
        let n = recv_batch_within(&b, &mut rx);
        lens.extend((0..n).filter_map(|i| b.datagram(&rx, i).map(|(m, _)| m.len)));
    }
    assert_eq!(lens, [5, 6]);
}

#[test]
fn tx_batch_keeps_the_unsent_tail_in_order() {
    // Loopback orphans a sent skb at once, so `WouldBlock` cannot be forced on it; this
    // checks the bookkeeping `send_batch` relies on when the kernel takes only a prefix.
    let dst = SocketAddr::new(V4, 9);
    let mut tx = TxBatch::new(4, 8);
    assert!(tx.is_empty() && !tx.is_full());
    for k in 0..4u8 {
        assert!(tx.push_appending(|buf| {
            buf.clear();
            buf.push(k);
            Some(dst)
        }));
    }
    assert!(tx.is_full());
    assert!(
        !tx.push_appending(|_| Some(dst)),
        "a full batch takes nothing"
    );
    assert!(
        !TxBatch::new(1, 8).push_appending(|_| None),
        "None leaves the slot free"
    );
    tx.consume(3);
    assert_eq!(tx.queued(), 1);
    assert_eq!(tx.pending()[0].data, [3]);
    assert_eq!(tx.pending()[0].dst.as_socket(), Some(dst));
    tx.consume(1);
    assert!(
        tx.is_empty() && !tx.is_full(),
        "an emptied batch reuses its slots"
    );
    assert!(tx.push_appending(|buf| {
        buf.clear();
        buf.push(9);
        Some(dst)
    }));
    assert_eq!(tx.pending().len(), 1);
    assert_eq!(tx.pending()[0].data, [9]);
}

#[test]
fn a_full_batch_of_large_datagrams_goes_out() {
    let a = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let b = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let mut tx = TxBatch::new(64, 16);
    while tx.push_appending(|buf| {
        buf.clear();
        buf.resize(60_000, 2);
        Some(b.local_addr())
    }) {}
    assert!(tx.is_full());
    // 3.8 MB in one sendmmsg: all of it, or a prefix with the tail kept queued.
    if !a.send_batch(&mut tx, None).unwrap() {
        assert!(tx.queued() > 0 && tx.queued() < 64, "{}", tx.queued());
    }
    let mut rx = RecvBatch::new(64, 65_536);
    let n = recv_batch_within(&b, &mut rx);
    let (meta, d) = b.datagram(&rx, 0).unwrap();
    assert_eq!((meta.len, d.len()), (60_000, 60_000));
    assert!(n <= 64);
}

/// The destination QP of [`roce_like`]'s datagrams.
const ROCE_LIKE_QP: u32 = 0x11;

/// A RoCEv2-shaped datagram: `len - 4` bytes of `fill` but the destination QP
/// [`ROCE_LIKE_QP`] (bytes 5..8), then its ICRC for IPv4 ID 0 from `src` to `dst`.
fn roce_like(len: usize, fill: u8, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    roce_for_qp(len, fill, ROCE_LIKE_QP, src, dst)
}

/// Whether every byte of `d` but the destination QP's (5..8) is `fill`.
fn all_fill(d: &[u8], fill: u8) -> bool {
    d.iter()
        .enumerate()
        .all(|(i, &x)| (5..8).contains(&i) || x == fill)
}

/// [`roce_like`] for destination QP `qp`.
fn roce_for_qp(len: usize, fill: u8, qp: u32, src: SocketAddr, dst: SocketAddr) -> Vec<u8> {
    assert!(len >= 12, "room for a BTH");
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        panic!("IPv4 only")
    };
    let ip = crate::wire::icrc::IpHeaderInfo::V4 {
        src: s,
        dst: d,
        identification: 0,
        dont_fragment: true,
    };
    let mut v = vec![fill; len - 4];
    v[5..8].copy_from_slice(&qp.to_be_bytes()[1..]);
    crate::wire::icrc::append_icrc(&ip, src.port(), dst.port(), &mut v);
    v
}

#[test]
fn gso_trains_form_only_where_they_may() {
    let a = SocketAddr::new(V4, 5000);
    let b = SocketAddr::new(V4, 5001);
    let c = SocketAddr::new(V4, 5002);
    let mut tx = TxBatch::with_gso(4, 64, true);
    // Three full datagrams and a shorter tail to b: one train, closed by the tail.
    for fill in 0..3 {
        assert!(tx.push_datagram(b, &roce_like(100, fill, a, b)));
    }
    assert!(tx.push_datagram(b, &roce_like(60, 3, a, b)));
    assert_eq!(tx.queued(), 1);
    assert_eq!(tx.pending()[0].segment_len, 100);
    assert_eq!(tx.pending()[0].data.len(), 360);
    // Closed: the next datagram to b starts a new slot, as does one to c, and a longer one.
    assert!(tx.push_datagram(b, &roce_like(100, 4, a, b)));
    assert!(tx.push_datagram(c, &roce_like(100, 5, a, c)));
    assert!(tx.push_datagram(c, &roce_like(200, 6, a, c)));
    assert_eq!(tx.queued(), 4);
    assert!(tx.is_full());
    // Those that could not join were moved out whole.
    let lens: Vec<usize> = tx.pending().iter().map(|o| o.data.len()).collect();
    assert_eq!(lens, [360, 100, 100, 200]);
    assert_eq!(tx.pending()[3].data, roce_like(200, 6, a, c));
    // A full batch takes nothing, even a datagram that could join the newest train.
    assert!(!tx.push_datagram(c, &roce_like(200, 7, a, c)));
    // Segment k carries the ICRC for IPv4 ID k.
    let train = &tx.pending()[0].data;
    for (k, seg) in train.chunks(100).enumerate() {
        let ip = crate::wire::icrc::IpHeaderInfo::V4 {
            src: Ipv4Addr::LOCALHOST,
            dst: Ipv4Addr::LOCALHOST,
            identification: k as u16,
            dont_fragment: true,
        };
        assert!(
            crate::wire::icrc::verify_icrc(&ip, 5000, 5001, seg),
            "segment {k}"
        );
    }
    // A slot handed to the kernel does not grow; at most 64 datagrams per train.
    tx.consume(4);
    assert_eq!(tx.trains_sent(), 1);
    assert!(tx.push_datagram(c, &roce_like(200, 9, a, c)));
    assert_eq!(tx.pending()[0].data.len(), 200, "a fresh slot");
    tx.consume(1);
    for k in 0..70 {
        assert!(tx.push_datagram(c, &roce_like(40, k, a, c)));
    }
    assert_eq!(tx.queued(), 2);
    assert_eq!(tx.pending()[0].data.len(), 64 * 40);
    // Off: one datagram per slot.
    let mut plain = TxBatch::with_gso(4, 64, false);
    assert!(plain.push_datagram(b, &roce_like(100, 0, a, b)));
    assert!(plain.push_datagram(b, &roce_like(100, 1, a, b)));
    assert_eq!(plain.queued(), 2);
}

/// A train holds one destination QP: datagrams to one address for QPs A, A, B, B, A leave
/// as three trains (2, 2, 1), since the receiver's reuseport program steers each by its first.
#[test]
fn a_train_holds_one_destination_qp() {
    let a = SocketAddr::new(V4, 5000);
    let b = SocketAddr::new(V4, 5001);
    let mut tx = TxBatch::with_gso(8, 64, true);
    for (fill, qp) in [(0, 0x100), (1, 0x100), (2, 0x101), (3, 0x101), (4, 0x100)] {
        assert!(tx.push_datagram(b, &roce_for_qp(100, fill, qp, a, b)));
    }
    let trains: Vec<(usize, u32)> = tx
        .pending()
        .iter()
        .map(|o| {
            let qp = u32::from_be_bytes([0, o.data[5], o.data[6], o.data[7]]);
            (o.data.len() / 100, qp)
        })
        .collect();
    assert_eq!(trains, [(2, 0x100), (2, 0x101), (1, 0x100)]);
    // The second datagram of QP 0x101 is segment 1 of its own train: ICRC for IPv4 ID 1.
    let ip = crate::wire::icrc::IpHeaderInfo::V4 {
        src: Ipv4Addr::LOCALHOST,
        dst: Ipv4Addr::LOCALHOST,
        identification: 1,
        dont_fragment: true,
    };
    let second = &tx.pending()[1].data[100..];
    assert!(crate::wire::icrc::verify_icrc(&ip, 5000, 5001, second));
    // Datagrams too short to name a QP join nothing.
    let mut short = TxBatch::with_gso(4, 64, true);
    assert!(short.push_datagram(b, &[1, 2, 3]));
    assert!(short.push_datagram(b, &[1, 2, 3]));
    assert_eq!(short.queued(), 2);
}

proptest::proptest! {
    /// Whatever order datagrams come in, the slots cut at their segment length give back
    /// exactly the datagrams pushed, in order, each to its own destination, and segment `k`
    /// of a train carries the ICRC for IPv4 ID `k`; no train breaks the kernel's limits, and
    /// every train holds one destination QP.
    #[test]
    fn trains_give_back_every_datagram_in_order(
        pushes in proptest::collection::vec(
            (
                proptest::sample::select(vec![0u16, 0, 0, 1, 2]),
                proptest::sample::select(vec![0x11u32, 0x11, 0x11, 0x22]),
                proptest::prop_oneof![
                    3 => proptest::sample::select(vec![100usize, 100, 100, 1400]),
                    1 => 13usize..2000,
                ],
            ),
            1..300,
        ),
    ) {
        let src = SocketAddr::new(V4, 4791);
        let mut tx = TxBatch::with_gso(8, 64, true);
        let mut expect = Vec::new();
        let mut got = Vec::new();
        let drain = |tx: &mut TxBatch, got: &mut Vec<(SocketAddr, Vec<u8>, usize)>| {
            for o in tx.pending() {
                let dst = o.dst.as_socket().unwrap();
                let seg = if o.segment_len == 0 { o.data.len() } else { usize::from(o.segment_len) };
                proptest::prop_assert!(o.data.len() <= 65_507);
                proptest::prop_assert!(o.data.len().div_ceil(seg) <= 64);
                let qp = &o.data[5..8];
                for (k, d) in o.data.chunks(seg).enumerate() {
                    proptest::prop_assert_eq!(&d[5..8], qp, "a train of two QPs");
                    got.push((dst, d.to_vec(), k));
                }
            }
            let n = tx.queued();
            tx.consume(n);
            Ok(())
        };
        for (i, (port, qp, len)) in pushes.into_iter().enumerate() {
            let dst = SocketAddr::new(V4, 5000 + port);
            let d = roce_for_qp(len, i as u8, qp, src, dst);
            if !tx.push_datagram(dst, &d) {
                drain(&mut tx, &mut got)?;
                proptest::prop_assert!(tx.push_datagram(dst, &d));
            }
            expect.push((dst, d));
        }
        drain(&mut tx, &mut got)?;
        proptest::prop_assert_eq!(got.len(), expect.len());
        for ((dst, sent), (gdst, wire, k)) in expect.iter().zip(&got) {
            proptest::prop_assert_eq!(dst, gdst);
            proptest::prop_assert_eq!(&sent[..sent.len() - 4], &wire[..wire.len() - 4]);
            let ip = crate::wire::icrc::IpHeaderInfo::V4 {
                src: Ipv4Addr::LOCALHOST,
                dst: Ipv4Addr::LOCALHOST,
                identification: *k as u16,
                dont_fragment: true,
            };
            proptest::prop_assert!(crate::wire::icrc::verify_icrc(&ip, 4791, dst.port(), wire));
        }
    }
}

#[test]
fn an_ipv6_train_needs_no_icrc_shift() {
    let Ok(a) = UdpTransport::bind(SocketAddr::new(V6, 0)) else {
        println!("skipped: no IPv6 loopback");
        return;
    };
    let b = UdpTransport::bind(SocketAddr::new(V6, 0)).unwrap();
    let ip = crate::wire::icrc::IpHeaderInfo::V6 {
        src: Ipv6Addr::LOCALHOST,
        dst: Ipv6Addr::LOCALHOST,
    };
    let (sport, dport) = (a.local_addr().port(), b.local_addr().port());
    let mut tx = TxBatch::with_gso(4, 64, true);
    for k in 0..5u8 {
        let mut d = vec![k; 996];
        d[5..8].copy_from_slice(&ROCE_LIKE_QP.to_be_bytes()[1..]);
        crate::wire::icrc::append_icrc(&ip, sport, dport, &mut d);
        assert!(tx.push_datagram(b.local_addr(), &d));
    }
    assert_eq!(tx.queued(), 1);
    assert!(a.send_batch(&mut tx, None).unwrap());
    let mut rx = RecvBatch::new(8, 65_536);
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(1);
    while got < 5 && Instant::now() < deadline {
        let n = recv_batch_within(&b, &mut rx);
        for i in 0..n {
            let (_, d) = b.datagram(&rx, i).unwrap();
            assert_eq!(d.len(), 1000);
            assert!(all_fill(&d[..996], got as u8));
            assert!(crate::wire::icrc::verify_icrc(&ip, sport, dport, d));
            got += 1;
        }
    }
    assert_eq!(got, 5);
}

#[test]
fn a_refused_train_turns_gso_off() {
    // The kernel refuses any datagram to port 0 (EINVAL); standing in for a route or
    // device that refuses GSO, it shows the bookkeeping: the train is dropped (RC
    // retransmits), the error names GSO, and later datagrams go one by one.
    let a = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let nowhere = SocketAddr::new(V4, 0);
    let mut tx = TxBatch::with_gso(4, 64, true);
    for k in 0..3 {
        assert!(tx.push_datagram(nowhere, &roce_like(100, k, a.local_addr(), nowhere)));
    }
    assert_eq!(tx.queued(), 1);
    let err = a.send_batch(&mut tx, None).unwrap_err();
    assert!(err.to_string().contains("GSO"), "{err}");
    assert!(err.gso_off && !err.too_big, "{err:?}");
    assert!(!tx.gso_enabled());
    assert!(tx.is_empty());
    for k in 0..3 {
        assert!(tx.push_datagram(nowhere, &roce_like(100, k, a.local_addr(), nowhere)));
    }
    assert_eq!(tx.queued(), 3, "one datagram per slot from now on");
}

#[test]
fn a_gso_train_arrives_as_sent() {
    let a = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let b = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let gro = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    if let Err(e) = gro.enable_gro() {
        println!("skipped: no UDP GRO ({e})");
        return;
    }
    for dst in [b.local_addr(), gro.local_addr()] {
        let mut tx = TxBatch::with_gso(4, 64, true);
        for k in 0..10u8 {
            let len = if k == 9 { 500 } else { 1000 };
            assert!(tx.push_datagram(dst, &roce_like(len, k, a.local_addr(), dst)));
        }
        assert_eq!(tx.queued(), 1);
        assert!(a.send_batch(&mut tx, None).unwrap());
        assert_eq!(tx.trains_sent(), 1);
    }
    // Without GRO the kernel cuts the train apart: ten datagrams, segment k with ID k.
    let mut rx = RecvBatch::new(16, 65_536);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1);
    while got.len() < 10 && Instant::now() < deadline {
        let n = recv_batch_within(&b, &mut rx);
        for i in 0..n {
            let (meta, d) = b.datagram(&rx, i).unwrap();
            assert_eq!(meta.segment_len, None);
            got.push(d.to_vec());
        }
    }
    assert_eq!(got.len(), 10);
    for (k, d) in got.iter().enumerate() {
        assert_eq!(d.len(), if k == 9 { 500 } else { 1000 });
        assert!(all_fill(&d[..d.len() - 4], k as u8));
        let ip = crate::wire::icrc::IpHeaderInfo::V4 {
            src: Ipv4Addr::LOCALHOST,
            dst: Ipv4Addr::LOCALHOST,
            identification: k as u16,
            dont_fragment: true,
        };
        assert!(crate::wire::icrc::verify_icrc(
            &ip,
            a.local_addr().port(),
            b.local_addr().port(),
            d
        ));
    }
    // With GRO the train stays whole, with its segment length.
    let n = recv_batch_within(&gro, &mut rx);
    assert_eq!(n, 1);
    let (meta, d) = gro.datagram(&rx, 0).unwrap();
    assert_eq!((meta.segment_len, d.len()), (Some(1000), 9500));
}

#[test]
fn readable_through_mio() {
    let mut poll = Poll::new().unwrap();
    let mut events = Events::with_capacity(8);
    let rx = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let tx = UdpTransport::bind(SocketAddr::new(V4, 0)).unwrap();
    let fd = rx.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&fd), Token(7), Interest::READABLE)
        .unwrap();
    assert!(tx.send_to(b"wake", rx.local_addr()).unwrap());
    poll.poll(&mut events, Some(Duration::from_secs(2)))
        .unwrap();
    assert!(events
        .iter()
        .any(|e| e.token() == Token(7) && e.is_readable()));
    let mut buf = [0u8; 64];
    let meta = rx.recv(&mut buf).unwrap().expect("readable, so a datagram");
    assert_eq!(&buf[..meta.len], b"wake");
    poll.registry().deregister(&mut SourceFd(&fd)).unwrap();
}

/// A refusal says the datagram was larger than the link carries for `EMSGSIZE`, and for a
/// train refused with `EINVAL` whose segments' packets exceed the link's MTU (how the kernel
/// refuses a GSO size above it); an `EINVAL` train that fits is a GSO refusal.
#[test]
fn a_refusal_is_too_big_only_for_the_link_it_exceeds() {
    let msgsize = io::Error::from_raw_os_error(libc::EMSGSIZE);
    let inval = io::Error::from_raw_os_error(libc::EINVAL);
    assert!(exceeds_link(&msgsize, false, 100, false, None));
    assert!(exceeds_link(&msgsize, true, 100, true, Some(9000)));
    // 4,168 bytes of RoCEv2 (path MTU 4096) and 28 of headers do not fit 1,500.
    assert!(exceeds_link(&inval, true, 4168, false, Some(1500)));
    assert!(!exceeds_link(&inval, true, 1096, false, Some(1500)));
    // IPv6 headers are 48 bytes: 1,453 + 48 > 1,500, 1,452 + 48 fits.
    assert!(exceeds_link(&inval, true, 1453, true, Some(1500)));
    assert!(!exceeds_link(&inval, true, 1452, true, Some(1500)));
    assert!(
        !exceeds_link(&inval, false, 4168, false, Some(1500)),
        "only trains"
    );
    assert!(
        !exceeds_link(&inval, true, 4168, false, None),
        "no MTU known"
    );
}

/// A BTH (12 bytes) for destination QP `qpn`, then 8 bytes of payload: enough for the
/// steering program, which reads only the destination QP.
fn bth_for(qpn: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[0] = 0x04; // RC SEND_ONLY
    b[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes());
    b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    b
}

/// Sends, from one socket (one source port, so the hash alone would pick one socket), a BTH
/// for each QPN of `qpns` to a group of `workers` steered sockets on loopback `ip`; returns
/// the destination QPs each socket received, in socket order.
fn steer_on_loopback(ip: IpAddr, workers: u32, qpns: &[u32], framing: Framing) -> Vec<Vec<u32>> {
    let count = WorkerCount::new(workers).unwrap();
    let group = UdpTransport::bind_steered(SocketAddr::new(ip, 0), count, framing).unwrap();
    assert_eq!(group.len(), workers as usize);
    let to = group[0].local_addr();
    assert!(group.iter().all(|t| t.local_addr() == to), "one address");
    let tx = UdpTransport::bind(SocketAddr::new(ip, 0)).unwrap();
    // On the InfiniBand link: an LRH of IBA local before the BTH.
    let lrh: &[u8] = match framing {
        Framing::Bth => &[],
        Framing::Lrh => &[0x70, 0x02, 0, 5, 0, 9, 0, 7],
    };
    for &q in qpns {
        let d = [lrh, &bth_for(q)[..]].concat();
        assert!(tx.send_to(&d, to).unwrap());
    }
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); group.len()];
    let mut buf = [0u8; 2048];
    let deadline = Instant::now() + Duration::from_secs(2);
    while got.iter().map(Vec::len).sum::<usize>() < qpns.len() && Instant::now() < deadline {
        for (i, t) in group.iter().enumerate() {
            while let Some(m) = t.recv(&mut buf).unwrap() {
                let q = framing.dest_qpn(&buf[..m.len]).unwrap().get();
                assert_eq!(m.len, 20 + lrh.len());
                got[i].push(q);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

/// Steered groups of 2 and 4 sockets on loopback (IPv4, and IPv6 where there is one): each
/// BTH (RoCEv2's, or behind an LRH on the InfiniBand link) reaches the socket of its QPN's low
/// bits, QP1 and the multicast QPN socket 0; one worker is a plain socket.
#[test]
fn a_steered_group_delivers_by_destination_qp() {
    for ip in [V4, V6] {
        if UdpTransport::bind(SocketAddr::new(ip, 0)).is_err() {
            println!("skipped {ip}: no loopback of that family");
            continue;
        }
        steer_by_qp(ip, Framing::Bth);
        steer_by_qp(ip, Framing::Lrh);
    }
}

fn steer_by_qp(ip: IpAddr, framing: Framing) {
    let qpns: Vec<u32> = (0x100..0x140).chain([1, 0xFF_FFFF]).collect();
    for workers in [2u32, 4] {
        let got = steer_on_loopback(ip, workers, &qpns, framing);
        for (i, qs) in got.iter().enumerate() {
            for &q in qs {
                let want = if q == 1 || q == 0xFF_FFFF {
                    0
                } else {
                    q & (workers - 1)
                };
                assert_eq!(
                    want as usize, i,
                    "QPN {q:#x} reached socket {i} of {workers}"
                );
            }
        }
        let per: Vec<usize> = got.iter().map(Vec::len).collect();
        let even = 64 / workers as usize;
        let mut want = vec![even; workers as usize];
        want[0] += 2;
        assert_eq!(per, want, "{workers} workers");
    }
    let one = steer_on_loopback(ip, 1, &qpns, framing);
    assert_eq!(one[0].len(), qpns.len());
}

/// One worker binds as `bind` does (no SO_REUSEPORT); a steered group holds its address
/// against a second group and a plain socket, as a bound socket does.
#[test]
fn steered_groups_hold_their_address() {
    let one =
        UdpTransport::bind_steered(SocketAddr::new(V4, 0), WorkerCount::ONE, Framing::Bth).unwrap();
    assert_eq!(one.len(), 1);
    assert!(!one[0].sock.reuse_port().unwrap());
    let two = WorkerCount::new(2).unwrap();
    let err = UdpTransport::bind_steered(one[0].local_addr(), two, Framing::Bth).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{err}");

    let group = UdpTransport::bind_steered(SocketAddr::new(V4, 0), two, Framing::Bth).unwrap();
    assert!(group.iter().all(|t| t.sock.reuse_port().unwrap()));
    let at = group[0].local_addr();
    for workers in [1, 2] {
        let err = UdpTransport::bind_steered(at, WorkerCount::new(workers).unwrap(), Framing::Bth)
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse, "{workers}: {err}");
    }
    // Each socket has the options of a plain one.
    for t in &group {
        assert_eq!(
            sockopt::pmtudisc(&t.sock, false).unwrap(),
            libc::IP_PMTUDISC_DO
        );
        assert!(t.sock.nonblocking().unwrap());
        assert!(t.sock.recv_buffer_size().unwrap() > 0);
        t.enable_gro().unwrap();
    }
}
