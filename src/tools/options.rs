//! What a tool run takes: one [`Options`] for every tool, with the tool's own part in
//! [`Options::tool`].

use std::net::IpAddr;
use std::time::Duration;

use crate::soft::FaultConfig;
use crate::verbs::{PathMtu, WrId};

/// The `wr_id` of every send a tool posts.
pub const SEND_WRID: WrId = WrId(1);

/// The `wr_id` of every receive a tool posts.
pub const RECV_WRID: WrId = WrId(2);

/// The UDP port of RoCEv2 (IANA), both directions, unless a tool is told otherwise.
pub const ROCE_V2_UDP_PORT: u16 = 4791;

/// A tool run: the peer, the QP-info exchange, the underlay, how much to move and for how
/// long, and in `tool` what only that tool takes (`()` for ud-pingpong).
#[derive(Debug, Clone, PartialEq)]
pub struct Options<T = ()> {
    /// Peer host (client mode); `None` makes this side the server.
    pub peer: Option<IpAddr>,
    /// Local underlay address; derived from the route to the peer (client) or the accepted TCP
    /// connection (server) when absent.
    pub bind: Option<IpAddr>,
    /// TCP port of the QP-info exchange.
    pub tcp_port: u16,
    /// UDP port of RoCEv2 traffic, both directions.
    pub udp_port: u16,
    /// Message size in bytes.
    pub size: usize,
    /// Messages or round trips.
    pub iters: u32,
    /// Receive WRs kept posted.
    pub rx_depth: u32,
    /// Verify the ICRC of IPv4 packets (peers with random IP IDs, such as rxe, need it no
    /// different: the receiver solves for the ID).
    pub verify_icrc_v4: bool,
    /// Give up after this long.
    pub deadline: Duration,
    /// What only this tool takes.
    pub tool: T,
}

impl<T> Options<T> {
    /// This side connects (it was given a peer) rather than waits.
    pub fn is_client(&self) -> bool {
        self.peer.is_some()
    }
}

/// What the RC tools (rc-pingpong, perf) take beyond [`Options`]: the path, the QP's
/// retransmission timer and the faults injected on what this side sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RcLink {
    /// Path MTU.
    pub mtu: PathMtu,
    /// Local ACK timeout exponent (`4.096 µs · 2^n`); rdma-core uses 14.
    pub qp_timeout: u8,
    /// Fault injection on what this side sends.
    pub faults: FaultConfig,
}
