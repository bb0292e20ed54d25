//! The TX table: every active connection, the index by peer, and the send buffers they share.

use std::collections::VecDeque;
use std::time::Instant;

use super::TxState;
use crate::cm::CommId;
use crate::ipoib::qp_conns::QpConns;
use crate::timer::TimerId;
use crate::verbs::{BufId, Gid, Lid, PathMtu, Psn, QpNum};
use crate::wire::ipoib::HwAddr;
use crate::wire::PeerMap;

/// One active connection.
#[derive(Debug)]
pub(in crate::ipoib) struct TxConn {
    pub(in crate::ipoib) id: CommId,
    pub(in crate::ipoib) peer: HwAddr,
    /// Its REQ went to the peer's rdma_cm service with a `cma_hdr` (not to the standard
    /// service ID): a REJ 8 then ends it instead of drawing the one retry there.
    pub(in crate::ipoib) rdma_cm: bool,
    pub(in crate::ipoib) state: TxState,
    /// The peer's receive size minus the IPoIB header: the largest IP packet.
    pub(in crate::ipoib) mtu: u32,
    /// The path MTU its REQ carried and its QP moves to: RC packets are cut to it.
    pub(in crate::ipoib) path_mtu: PathMtu,
    /// The peer's LID its REQ and QP use (an InfiniBand port; [`Lid::NONE`] on RoCE): a
    /// new path to another LID ends the connection.
    pub(in crate::ipoib) dlid: Lid,
    pub(in crate::ipoib) our_psn: Psn,
    /// The peer's CA GUID, from its REP (`None` until then).
    pub(in crate::ipoib) remote_ca_guid: Option<u64>,
    /// The REP came and the QP is still moving to RTS ([`Verbs::begin_moves`]): the RTU goes
    /// out when it is there, and the connection carries IP packets of up to this size.
    ///
    /// [`Verbs::begin_moves`]: crate::verbs::Verbs::begin_moves
    pub(in crate::ipoib) moving: Option<u32>,
    /// Packets waiting for the connection (with their ethertype).
    pub(in crate::ipoib) queue: VecDeque<(u16, Vec<u8>)>,
    /// Sends posted and not completed: send buffers this connection holds.
    pub(in crate::ipoib) outstanding: u32,
    /// The teardown bound, armed while closing with sends in flight.
    pub(in crate::ipoib) watchdog: Option<TimerId>,
    /// When a send last completed, or the first of the sends now in flight was posted.
    pub(in crate::ipoib) progress_at: Instant,
    /// The stall check, armed while sends are in flight.
    pub(in crate::ipoib) stall: Option<TimerId>,
}

/// The active connections by QP number, the open ones by peer, and the free send buffers.
///
/// Invariant: `by_peer` maps a peer's `(GID, UD QPN)` only to a connection in `conns` that is
/// not closing; every send buffer is either in `free`, in flight on a connection (counted in
/// its `outstanding`), or lent to the driver for a TUN read.
#[derive(Debug)]
pub(in crate::ipoib) struct TxTable {
    conns: QpConns<TxConn>,
    by_peer: PeerMap<(Gid, QpNum), QpNum>,
    free: Vec<BufId>,
}

impl TxTable {
    /// An empty table with the send buffers `free`.
    pub(in crate::ipoib) fn new(free: Vec<BufId>) -> Self {
        Self {
            conns: QpConns::default(),
            by_peer: PeerMap::default(),
            free,
        }
    }

    /// The connection on `qpn`, to change (reading goes through [`QpConns`]).
    pub(in crate::ipoib) fn get_mut(&mut self, qpn: &QpNum) -> Option<&mut TxConn> {
        self.conns.get_mut(qpn)
    }

    /// The open connection to `hw`, if any.
    pub(in crate::ipoib) fn to_peer(&self, hw: HwAddr) -> Option<QpNum> {
        self.by_peer.get(&(hw.gid, hw.qpn)).copied()
    }

    /// The established connection a packet of `packet_len` bytes to `hw` may go on right
    /// now, if any and the packet fits its MTU: the fast path of `Endpoint::send_rc` for a
    /// packet already in a send buffer (anything else takes the general path).
    pub(in crate::ipoib) fn established_to(&self, hw: HwAddr, packet_len: usize) -> Option<QpNum> {
        let qpn = self.to_peer(hw)?;
        let tx = self.conns.get(&qpn)?;
        (tx.state == TxState::Established && packet_len <= tx.mtu as usize).then_some(qpn)
    }

    /// Open connections to the node `gid`, at any UD QPN (any incarnation).
    pub(in crate::ipoib) fn to_node(&self, gid: Gid) -> Vec<QpNum> {
        self.by_peer
            .iter()
            .filter(|((g, _), _)| *g == gid)
            .map(|(_, q)| *q)
            .collect()
    }

    /// Adds a new connection to `conn.peer`.
    pub(in crate::ipoib) fn insert(&mut self, qpn: QpNum, conn: TxConn) {
        self.by_peer.insert((conn.peer.gid, conn.peer.qpn), qpn);
        self.conns.insert(qpn, conn);
    }

    /// `qpn` no longer carries new packets to its peer (it is closing). One lookup: the
    /// index maps a peer only to a connection to that peer.
    pub(in crate::ipoib) fn unmap_peer(&mut self, qpn: QpNum) {
        let Some(peer) = self.conns.get(&qpn).map(|t| (t.peer.gid, t.peer.qpn)) else {
            return;
        };
        if self.by_peer.get(&peer) == Some(&qpn) {
            self.by_peer.remove(&peer);
        }
    }

    /// Forgets `qpn`.
    pub(in crate::ipoib) fn remove(&mut self, qpn: QpNum) -> Option<TxConn> {
        self.unmap_peer(qpn);
        self.conns.remove(&qpn)
    }

    /// Takes a free send buffer.
    pub(in crate::ipoib) fn take_buf(&mut self) -> Option<BufId> {
        self.free.pop()
    }

    /// Gives a send buffer back.
    pub(in crate::ipoib) fn put_buf(&mut self, b: BufId) {
        self.free.push(b);
    }

    /// Free send buffers.
    #[cfg(test)]
    pub(in crate::ipoib) fn free_bufs(&self) -> usize {
        self.free.len()
    }
}

impl std::ops::Deref for TxTable {
    type Target = QpConns<TxConn>;

    fn deref(&self) -> &QpConns<TxConn> {
        &self.conns
    }
}
