//! The TUN module in a network namespace: create, set MTU 65520, add IPv4 and IPv6 addresses
//! with ioctls, bring up; then the kernel routes pings for the subnet into the TUN and the echo
//! replies written back reach `ping`, including 65000-byte ones. A multi-queue interface: one
//! flow's packets leave by one queue, flows spread over both, a packet written on either
//! queue reaches a socket, and the interface goes with its last queue.
//!
//! The test builds its own namespace and removes it; without root it prints `skipped: ...`.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::netns::{output_within, wait_within, Lines};
use etherparse::{Icmpv4Type, Icmpv6Type, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use ipoib_cm::Tun;

const ROLE: &str = "IPOIB_CM_TUN_ROLE";
const V4: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
const V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x19, 0, 0, 0, 0, 1);

#[test]
fn tun_is_configured_and_carries_packets() {
    let lab = crate::lab_or_skip!("ipcmtun", 2, 1500);
    let exe = std::env::current_exe().expect("test binary");
    let mut child = lab
        .exec(
            1,
            &[
                exe.as_os_str(),
                "--exact".as_ref(),
                "tun_echo_child".as_ref(),
                "--ignored".as_ref(),
                "--nocapture".as_ref(),
            ],
        )
        .env(ROLE, "echo")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let mut out = Lines::new(child.stdout.take().expect("stdout"));
    assert!(
        out.wait_for("READY", Duration::from_secs(20)),
        "child: {:?}",
        out.seen()
    );
    let show = output_within(
        lab.exec(1, &["ip", "addr", "show", "dev", "ibt0"]),
        Duration::from_secs(5),
    );
    let show = String::from_utf8_lossy(&show.stdout).to_string();
    assert!(show.contains("mtu 65520"), "{show}");
    assert!(show.contains("inet 198.19.0.1/24"), "{show}");
    assert!(show.contains("inet6 2001:db8:19::1/64"), "{show}");
    assert!(show.contains("UP"), "{show}");
    for args in [
        vec![
            "ping",
            "-n",
            "-c",
            "2",
            "-i",
            "0.2",
            "-W",
            "2",
            "198.19.0.2",
        ],
        vec![
            "ping",
            "-n",
            "-c",
            "1",
            "-s",
            "65000",
            "-W",
            "2",
            "198.19.0.2",
        ],
        vec![
            "ping",
            "-6",
            "-n",
            "-c",
            "2",
            "-i",
            "0.2",
            "-W",
            "2",
            "2001:db8:19::2",
        ],
    ] {
        let o = output_within(lab.exec(1, &args), Duration::from_secs(15));
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{args:?}: {text}");
    }
    let _ = child.kill();
    wait_within(&mut child, Duration::from_secs(5));
}

/// Answers an echo request read from the TUN by writing the reply back.
fn echo_reply(pkt: &[u8]) -> Option<Vec<u8>> {
    let sp = SlicedPacket::from_ip(pkt).ok()?;
    let mut out = Vec::new();
    match (&sp.net, &sp.transport) {
        (Some(NetSlice::Ipv4(v4)), Some(TransportSlice::Icmpv4(icmp))) => {
            let Icmpv4Type::EchoRequest(e) = icmp.icmp_type() else {
                return None;
            };
            let h = v4.header();
            PacketBuilder::ipv4(h.destination(), h.source(), 64)
                .icmpv4_echo_reply(e.id, e.seq)
                .write(&mut out, icmp.payload())
                .ok()?;
        }
        (Some(NetSlice::Ipv6(v6)), Some(TransportSlice::Icmpv6(icmp))) => {
            let Icmpv6Type::EchoRequest(e) = icmp.icmp_type() else {
                return None;
            };
            let h = v6.header();
            PacketBuilder::ipv6(h.destination(), h.source(), 64)
                .icmpv6_echo_reply(e.id, e.seq)
                .write(&mut out, icmp.payload())
                .ok()?;
        }
        _ => return None,
    }
    Some(out)
}

/// Not a test on its own: run inside the namespace by [`tun_is_configured_and_carries_packets`].
#[test]
#[ignore = "helper, run inside a namespace by tun_is_configured_and_carries_packets"]
fn tun_echo_child() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let tun = Tun::create("ibt%d").expect("create TUN");
    assert_eq!(tun.name(), "ibt0");
    tun.set_mtu(65520).expect("mtu");
    tun.add_ipv4(V4, 24).expect("ipv4");
    tun.add_ipv6(V6, 64).expect("ipv6");
    tun.set_up().expect("up");
    println!("READY {}", tun.name());
    let mut buf = vec![0u8; 65536];
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        match tun.recv(&mut buf).expect("recv") {
            Some(n) => {
                if let Some(reply) = echo_reply(&buf[..n]) {
                    let dst: Option<IpAddr> =
                        SlicedPacket::from_ip(&reply)
                            .ok()
                            .and_then(|s| match s.net {
                                Some(NetSlice::Ipv4(v)) => {
                                    Some(v.header().destination_addr().into())
                                }
                                Some(NetSlice::Ipv6(v)) => {
                                    Some(v.header().destination_addr().into())
                                }
                                _ => None,
                            });
                    assert!(tun.send(&reply).expect("send"), "queue full");
                    println!("replied to {dst:?} ({} bytes)", reply.len());
                }
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// The multi-queue TUN's address in its namespace, and the peer address its subnet routes
/// into it.
const MQ_LOCAL: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 1);
const MQ_PEER: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 2);
/// The UDP port the flows sent into the interface go to.
const MQ_FLOW_PORT: u16 = 9000;

#[test]
fn multi_queue_tun_steers_flows_and_takes_writes_on_every_queue() {
    let lab = crate::lab_or_skip!("ipcmtunmq", 2, 1500);
    let exe = std::env::current_exe().expect("test binary");
    let out = output_within(
        {
            let mut c = lab.exec(
                1,
                &[
                    exe.as_os_str(),
                    "--exact".as_ref(),
                    "tun_multi_queue_child".as_ref(),
                    "--ignored".as_ref(),
                    "--nocapture".as_ref(),
                ],
            );
            c.env(ROLE, "multi-queue");
            c
        },
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(
        out.status.success(),
        "child failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("MQ-OK"), "{text}");
}

/// Reads every queue until `want` UDP packets to [`MQ_FLOW_PORT`] came out (or 5 s passed);
/// returns, per packet, its UDP source port and the queue it came from.
fn read_flows(queues: &[Tun], want: usize) -> Vec<(u16, usize)> {
    let mut buf = vec![0u8; 65536];
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(5);
    while seen.len() < want && Instant::now() < end {
        let mut idle = true;
        for (q, tun) in queues.iter().enumerate() {
            while let Some(n) = tun.recv(&mut buf).expect("recv") {
                idle = false;
                let Ok(sp) = SlicedPacket::from_ip(&buf[..n]) else {
                    continue;
                };
                if let Some(TransportSlice::Udp(udp)) = sp.transport {
                    if udp.destination_port() == MQ_FLOW_PORT {
                        seen.push((udp.source_port(), q));
                    }
                }
            }
        }
        if idle {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    seen
}

/// Not a test on its own: run inside a namespace by
/// [`multi_queue_tun_steers_flows_and_takes_writes_on_every_queue`].
#[test]
#[ignore = "helper, run inside a namespace by multi_queue_tun_steers_flows_and_takes_writes_on_every_queue"]
fn tun_multi_queue_child() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let queues = Tun::create_queues("ibq%d", 2).expect("create 2 queues");
    assert_eq!(queues.len(), 2);
    assert_eq!(queues[0].name(), "ibq0");
    assert_eq!(queues[1].name(), "ibq0", "both queues are one interface's");
    assert_eq!((queues[0].queue_index(), queues[1].queue_index()), (0, 1));
    // An exact name in use is refused, not joined.
    let e = Tun::create_queues("ibq0", 2).expect_err("ibq0 exists");
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");
    // The interface's configuration, once, on queue 0.
    queues[0].set_mtu(1500).expect("mtu");
    queues[0].add_ipv4(MQ_LOCAL, 24).expect("ipv4");
    queues[0].set_up().expect("up");

    // One flow (one source port): 32 packets, all out of one queue.
    let one = UdpSocket::bind((MQ_LOCAL, 0)).expect("bind flow socket");
    for i in 0..32u8 {
        one.send_to(&[i; 64], (MQ_PEER, MQ_FLOW_PORT))
            .expect("send into the TUN");
    }
    let seen = read_flows(&queues, 32);
    let per_queue = |seen: &[(u16, usize)]| {
        let mut n = [0usize; 2];
        for &(_, q) in seen {
            n[q] += 1;
        }
        n
    };
    let n = per_queue(&seen);
    println!("one flow, 32 packets: queue 0 {}, queue 1 {}", n[0], n[1]);
    assert_eq!(seen.len(), 32, "{seen:?}");
    assert!(n.contains(&32), "one flow split over queues: {n:?}");

    // 32 flows of 4 packets: each flow out of one queue, and both queues carry some.
    let flows: Vec<UdpSocket> = (0..32)
        .map(|_| UdpSocket::bind((MQ_LOCAL, 0)).expect("bind flow socket"))
        .collect();
    for round in 0..4u8 {
        for s in &flows {
            s.send_to(&[round; 64], (MQ_PEER, MQ_FLOW_PORT))
                .expect("send into the TUN");
        }
    }
    let seen = read_flows(&queues, 128);
    assert_eq!(seen.len(), 128, "{} of 128 packets came out", seen.len());
    let mut flow_queue = std::collections::BTreeMap::new();
    for &(port, q) in &seen {
        let first = *flow_queue.entry(port).or_insert(q);
        assert_eq!(first, q, "flow from port {port} left by both queues");
    }
    let flows_on = |q| flow_queue.values().filter(|&&v| v == q).count();
    println!(
        "32 flows x 4 packets: {} flows by queue 0, {} by queue 1, no flow split",
        flows_on(0),
        flows_on(1)
    );
    assert!(flows_on(0) > 0 && flows_on(1) > 0, "{flow_queue:?}");

    // A packet written on either queue enters the stack and reaches a socket.
    let rx = UdpSocket::bind((MQ_LOCAL, 9100)).expect("bind receiver");
    rx.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    for (q, tun) in queues.iter().enumerate() {
        let mut pkt = Vec::new();
        PacketBuilder::ipv4(MQ_PEER.octets(), MQ_LOCAL.octets(), 64)
            .udp(7000, 9100)
            .write(&mut pkt, format!("queue {q}").as_bytes())
            .expect("build");
        assert!(tun.send(&pkt).expect("write"), "queue {q} full");
        let mut buf = [0u8; 64];
        let (n, from) = rx.recv_from(&mut buf).expect("the written packet arrives");
        assert_eq!(&buf[..n], format!("queue {q}").as_bytes());
        assert_eq!(from, (MQ_PEER, 7000).into());
        println!("a packet written on queue {q} reached the socket");
    }

    // The interface outlives a queue and goes with the last one.
    let exists = || std::path::Path::new("/sys/class/net/ibq0").exists();
    assert!(exists(), "/sys shows this namespace's interfaces");
    let mut queues = queues;
    drop(queues.remove(0));
    assert!(exists(), "the interface outlives queue 0");
    drop(queues);
    let end = Instant::now() + Duration::from_secs(2);
    while exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!exists(), "the interface outlived its last queue");
    println!("dropping both queues removed the interface");
    println!("MQ-OK");
}
