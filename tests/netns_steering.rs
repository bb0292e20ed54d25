//! Reuseport steering of the soft provider's datagrams, in network namespaces: node 2 sends
//! crafted RoCEv2 BTHs from ONE UDP source port (one 4-tuple, so the kernel's hash alone
//! delivers them all to one socket) to node 1's port 4791, where a steered group of N sockets
//! ([`UdpTransport::bind_steered`]) is bound. With N = 2 and 4 every BTH reaches the socket
//! of its destination QP's worker (the QPN's low bits), QP1 and the multicast QPN socket 0;
//! with N = 1 one plain socket takes everything. A group without the program (`SO_REUSEPORT`
//! only) shows what the hash alone does: one socket takes all.
//!
//! The test builds its own namespaces and removes them; without root it prints `skipped: ...`.

mod common;

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::netns::{output_within, wait_within, Lines};
use ipoib_cm::soft::transport::UdpTransport;
use ipoib_cm::wire::{Framing, WorkerCount};

const ROLE: &str = "IPOIB_CM_STEER_ROLE";
const WORKERS: &str = "IPOIB_CM_STEER_WORKERS";
const TO: &str = "IPOIB_CM_STEER_TO";
/// The sender's one source port.
const SRC_PORT: u16 = 50_000;
/// Destination QPs of the spread: 0x100..0x140 (64), then QP1 and the multicast QPN.
const SPREAD: std::ops::Range<u32> = 0x100..0x140;
const QP1: u32 = 1;
const MULTICAST: u32 = 0x00FF_FFFF;

fn qpns() -> Vec<u32> {
    SPREAD.chain([QP1, MULTICAST]).collect()
}

/// A BTH (RC SEND_ONLY, P_Key 0xFFFF) for destination QP `qpn`, PSN `qpn`, and 16 bytes of
/// payload: the steering reads only the destination QP.
fn bth_for(qpn: u32) -> [u8; 28] {
    let mut b = [0u8; 28];
    b[0] = 0x04;
    b[2..4].copy_from_slice(&0xFFFFu16.to_be_bytes());
    b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
    b[9..12].copy_from_slice(&qpn.to_be_bytes()[1..]);
    b
}

fn self_exec(test: &str) -> Vec<std::ffi::OsString> {
    let exe = std::env::current_exe().expect("test binary");
    vec![
        exe.into_os_string(),
        "--exact".into(),
        test.into(),
        "--ignored".into(),
        "--nocapture".into(),
    ]
}

/// Binds a group of `workers` in node 1 (`hash`: `SO_REUSEPORT` sockets without the
/// program), has node 2 send the BTHs, and returns what the receiver printed.
fn run(lab: &common::netns::Lab, workers: u32, hash: bool) -> String {
    let mut rx = lab.exec(1, &self_exec("steering_receiver_child"));
    rx.env(ROLE, if hash { "hash" } else { "steered" })
        .env(WORKERS, workers.to_string())
        .env(TO, SocketAddr::new(lab.addr(1).into(), 4791).to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut rx = rx.spawn().expect("spawn receiver");
    let mut out = Lines::new(rx.stdout.take().expect("stdout"));
    let mut err = Lines::new(rx.stderr.take().expect("stderr"));
    assert!(
        out.wait_for("READY", Duration::from_secs(20)),
        "receiver: {:?} {:?}",
        out.seen(),
        err.finish(Duration::from_secs(1))
    );
    let mut tx = lab.exec(2, &self_exec("steering_sender_child"));
    tx.env(ROLE, "send")
        .env(TO, SocketAddr::new(lab.addr(1).into(), 4791).to_string())
        .env("IPOIB_CM_STEER_FROM", lab.addr(2).to_string());
    let sent = output_within(tx, Duration::from_secs(20));
    assert!(
        sent.status.success(),
        "sender: {}{}",
        String::from_utf8_lossy(&sent.stdout),
        String::from_utf8_lossy(&sent.stderr)
    );
    let status = wait_within(&mut rx, Duration::from_secs(20));
    let text = out.finish(Duration::from_secs(2)).join("\n");
    let errs = err.finish(Duration::from_secs(2)).join("\n");
    println!("{text}");
    assert!(status.success(), "receiver failed: {text}\n{errs}");
    text
}

#[test]
fn crafted_bths_reach_the_socket_of_their_qps_worker() {
    let lab = crate::lab_or_skip!("ipcmsteer", 2, 1500);
    for workers in [1u32, 2, 4] {
        let text = run(&lab, workers, false);
        assert!(text.contains(&format!("STEERED-OK {workers}")), "{text}");
    }
    let text = run(&lab, 2, true);
    assert!(text.contains("HASH-ONE-SOCKET"), "{text}");
}

/// Not a test on its own: run in node 2 by [`crafted_bths_reach_the_socket_of_their_qps_worker`].
#[test]
#[ignore = "helper, run inside a namespace by crafted_bths_reach_the_socket_of_their_qps_worker"]
fn steering_sender_child() {
    if std::env::var(ROLE).as_deref() != Ok("send") {
        return;
    }
    let to: SocketAddr = std::env::var(TO).unwrap().parse().unwrap();
    let from: IpAddr = std::env::var("IPOIB_CM_STEER_FROM")
        .unwrap()
        .parse()
        .unwrap();
    let s = UdpSocket::bind((from, SRC_PORT)).expect("bind the one source port");
    for q in qpns() {
        s.send_to(&bth_for(q), to).expect("send");
        // Paced: the receiver's queues never overflow.
        std::thread::sleep(Duration::from_micros(200));
    }
    println!("sent {} BTHs from {from}:{SRC_PORT}", qpns().len());
}

/// Not a test on its own: run in node 1 by [`crafted_bths_reach_the_socket_of_their_qps_worker`].
#[test]
#[ignore = "helper, run inside a namespace by crafted_bths_reach_the_socket_of_their_qps_worker"]
fn steering_receiver_child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let workers: u32 = std::env::var(WORKERS).unwrap().parse().unwrap();
    let at: SocketAddr = std::env::var(TO).unwrap().parse().unwrap();
    let sockets: Vec<UdpSocket> = if role == "hash" {
        (0..workers)
            .map(|_| {
                let s = socket2::Socket::new(
                    socket2::Domain::IPV4,
                    socket2::Type::DGRAM,
                    Some(socket2::Protocol::UDP),
                )
                .unwrap();
                s.set_reuse_port(true).unwrap();
                s.bind(&at.into()).unwrap();
                s.set_nonblocking(true).unwrap();
                s.into()
            })
            .collect()
    } else {
        Vec::new()
    };
    let group = if role == "hash" {
        Vec::new()
    } else {
        UdpTransport::bind_steered(at, WorkerCount::new(workers).unwrap(), Framing::Bth)
            .expect("bind group")
    };
    let n = if role == "hash" {
        sockets.len()
    } else {
        group.len()
    };
    assert_eq!(n, workers as usize);
    println!("READY");
    let want = qpns().len();
    let mut got: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut buf = [0u8; 2048];
    let end = Instant::now() + Duration::from_secs(10);
    while got.iter().map(Vec::len).sum::<usize>() < want && Instant::now() < end {
        for (i, slot) in got.iter_mut().enumerate() {
            loop {
                let len = if role == "hash" {
                    match sockets[i].recv_from(&mut buf) {
                        Ok((len, _)) => Some(len),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                        Err(e) => panic!("recv: {e}"),
                    }
                } else {
                    group[i].recv(&mut buf).expect("recv").map(|m| {
                        assert_eq!(m.src.port(), SRC_PORT);
                        m.len
                    })
                };
                let Some(len) = len else { break };
                assert_eq!(len, 28);
                slot.push(u32::from_be_bytes([0, buf[5], buf[6], buf[7]]));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let per: Vec<usize> = got.iter().map(Vec::len).collect();
    println!(
        "{role}, {workers} sockets, {want} datagrams from one source port: {per:?} per socket"
    );
    assert_eq!(per.iter().sum::<usize>(), want, "{per:?}");
    if role == "hash" {
        assert!(per.contains(&want), "the hash split one 4-tuple: {per:?}");
        println!("HASH-ONE-SOCKET");
        return;
    }
    for (i, qs) in got.iter().enumerate() {
        for &q in qs {
            let owner = if q == QP1 || q == MULTICAST {
                0
            } else {
                q & (workers - 1)
            };
            assert_eq!(owner as usize, i, "QPN {q:#x} reached socket {i}");
        }
    }
    assert!(got[0].contains(&QP1) && got[0].contains(&MULTICAST));
    println!("STEERED-OK {workers}");
}
