//! The driver's [`Node`] embedded without the daemon: two processes, each in its own network
//! namespace, run the calling protocol of `ipoib_cm::driver` over the software provider with a
//! token of their own beside the node's (stdin, whose end starts the shutdown). Pings cross
//! the tunnel in connected mode, with the CM MADs on QP1 and on the UDP side channel, and
//! closing stdin stops both nodes through `begin_shutdown`, `should_finish` and `finish`.
//!
//! The test builds its own namespaces and removes them; without root it prints `skipped: ...`.

mod common;

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::netns::{output_within, wait_within, Lab, Lines};
use ipoib_cm::driver::{Node, NodeConfig};
use ipoib_cm::ipoib::EndpointConfig;
use ipoib_cm::mad::{CmTransport, DEFAULT_MAD_PORT};
use ipoib_cm::soft::provider::{SoftProvider, UdpOffload};
use ipoib_cm::soft::SoftConfig;
use ipoib_cm::verbs::Provider;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

const ROLE: &str = "IPOIB_CM_DRIVER_NODE";
const TRANSPORT: &str = "IPOIB_CM_DRIVER_TRANSPORT";
const IFNAME: &str = "ibn0";
/// The caller's own token; the node's follow it.
const STDIN: Token = Token(0);
/// Longest sleep of the child's loop.
const IDLE_WAKE: Duration = Duration::from_secs(1);

/// The tunnel address of node `k`.
fn tunnel_addr(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 77, k)
}

fn spawn_node(lab: &Lab, k: usize, transport: &str) -> (Child, Lines) {
    let exe = std::env::current_exe().expect("test binary");
    let mut child = lab
        .exec(
            k,
            &[
                exe.as_os_str(),
                "--exact".as_ref(),
                "node_child".as_ref(),
                "--ignored".as_ref(),
                "--nocapture".as_ref(),
            ],
        )
        .env(ROLE, k.to_string())
        .env(TRANSPORT, transport)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn node");
    let out = Lines::new(child.stdout.take().expect("stdout"));
    (child, out)
}

fn two_nodes_carry_pings_and_stop(prefix: &str, transport: &str) {
    let lab = crate::lab_or_skip!(prefix, 2, 1500);
    let mut nodes: Vec<(Child, Lines)> = (1..=2).map(|k| spawn_node(&lab, k, transport)).collect();
    for (k, (_, out)) in nodes.iter_mut().enumerate() {
        assert!(
            out.wait_for("READY", Duration::from_secs(20)),
            "node {}: {:?}",
            k + 1,
            out.seen()
        );
    }
    let ping = output_within(
        lab.exec(
            1,
            &[
                "ping",
                "-n",
                "-c",
                "3",
                "-i",
                "0.2",
                "-W",
                "2",
                &tunnel_addr(2).to_string(),
            ],
        ),
        Duration::from_secs(20),
    );
    assert!(
        ping.status.success(),
        "ping: {}",
        String::from_utf8_lossy(&ping.stdout)
    );
    for (k, (child, out)) in nodes.iter_mut().enumerate() {
        drop(child.stdin.take());
        assert!(
            out.wait_for("STOPPED", Duration::from_secs(20)),
            "node {}: {:?}",
            k + 1,
            out.seen()
        );
        let status = wait_within(child, Duration::from_secs(10));
        assert!(status.success(), "node {}: {status}", k + 1);
        let stopped = out
            .seen()
            .iter()
            .find(|l| l.contains("STOPPED"))
            .expect("the STOPPED line")
            .clone();
        assert!(
            stopped.contains("drained=true") && !stopped.contains("tx_established=0"),
            "node {}: no connection, or not drained: {stopped}",
            k + 1
        );
        assert!(
            !stopped.contains("rx_packets=0"),
            "node {}: {stopped}",
            k + 1
        );
        println!("node {}: {stopped}", k + 1);
        let link = output_within(
            lab.exec(k + 1, &["ip", "link", "show", IFNAME]),
            Duration::from_secs(5),
        );
        assert!(
            !link.status.success(),
            "node {}: {IFNAME} outlived the node",
            k + 1
        );
    }
}

#[test]
fn nodes_with_cm_on_qp1_carry_pings_and_stop() {
    two_nodes_carry_pings_and_stop("drvqp", "qp1");
}

#[test]
fn nodes_with_cm_on_udp_carry_pings_and_stop() {
    two_nodes_carry_pings_and_stop("drvudp", "udp");
}

/// Not a test on its own: one node of [`two_nodes_carry_pings_and_stop`], run inside its
/// namespace.
#[test]
#[ignore = "helper, run inside a namespace by two_nodes_carry_pings_and_stop"]
fn node_child() {
    let Ok(k) = std::env::var(ROLE) else {
        return;
    };
    let k: u8 = k.parse().expect("node number");
    let transport: CmTransport = std::env::var(TRANSPORT)
        .expect("transport")
        .parse()
        .expect("transport name");
    let bind = IpAddr::V4(Ipv4Addr::new(198, 18, 0, k));
    let other = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 3 - k));
    let mut prov = SoftProvider::bind(SoftConfig::new(bind), UdpOffload::Off).expect("bind");
    prov.verbs().set_mcast_peers(vec![other]);
    let mut endpoint = EndpointConfig::new(vec![(IpAddr::V4(tunnel_addr(k)), 24)]);
    endpoint.seed = u64::from(k);
    endpoint.drain_timeout = Duration::from_secs(2);
    let cfg = NodeConfig {
        ifname: IFNAME.to_owned(),
        endpoint,
        cm_transport: transport,
        mad_udp: SocketAddr::new(bind, DEFAULT_MAD_PORT),
        rdma_cm_bind: bind,
        link_layer: ipoib_cm::cm::LinkLayer::Ethernet,
        tun_write_rate: None,
    };

    let mut poll = Poll::new().expect("poll");
    let mut node =
        Node::new(Instant::now(), prov, cfg, poll.registry(), STDIN.0 + 1).expect("node set-up");
    assert_eq!(node.ifname(), IFNAME);
    assert!(node.tokens_end().0 > STDIN.0 + 1, "the node took no token");
    let mut stdin = std::fs::File::from(
        std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .expect("stdin"),
    );
    let stdin_fd = stdin.as_raw_fd();
    poll.registry()
        .register(&mut SourceFd(&stdin_fd), STDIN, Interest::READABLE)
        .expect("register stdin");
    println!("READY {}", node.endpoint().hwaddr());

    let mut events = Events::with_capacity(64);
    let mut stdin_closed = false;
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        let now = Instant::now();
        assert!(now < give_up, "the node never stopped");
        let timeout = if node.has_pending_input() {
            Duration::ZERO
        } else {
            node.poll_timeout()
                .map_or(IDLE_WAKE, |t| t.saturating_duration_since(now))
                .min(IDLE_WAKE)
        };
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("poll: {e}"),
        }
        let now = Instant::now();
        let mut stdin_ready = false;
        for ev in events.iter() {
            match ev.token() {
                STDIN => stdin_ready = true,
                t => assert!(node.note_readiness(t), "token {t:?} is no one's"),
            }
        }
        node.turn(now).expect("turn");
        if stdin_ready && !stdin_closed {
            let mut buf = [0u8; 64];
            if matches!(stdin.read(&mut buf), Ok(0) | Err(_)) {
                stdin_closed = true;
                poll.registry()
                    .deregister(&mut SourceFd(&stdin_fd))
                    .expect("deregister stdin");
                node.begin_shutdown(now);
                assert!(node.is_shutting_down());
            }
        }
        node.flush(now, poll.registry()).expect("flush");
        if node.should_finish(now) {
            let stopped = node.is_stopped();
            let counters = node.endpoint().counters();
            node.finish(now).expect("finish");
            println!(
                "STOPPED drained={stopped} tx_established={} rx_packets={}",
                counters.tx_established, counters.rx_packets
            );
            return;
        }
    }
}
