//! The TUN module in a network namespace: create, set MTU 65520, add IPv4 and IPv6 addresses
//! with ioctls, bring up; then the kernel routes pings for the subnet into the TUN and the echo
//! replies written back reach `ping`, including 65000-byte ones.
//!
//! The test builds its own namespace and removes it; without root it prints `skipped: ...`.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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
