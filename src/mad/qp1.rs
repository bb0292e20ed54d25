//! CM MADs over QP1, the General Services Interface, on any [`Verbs`] provider that lets the
//! caller own QP1 (the software provider does; with kernel verbs the kernel owns it).
//!
//! Each MAD travels as one UD SEND_ONLY to QP 1 of the peer with Q_Key `0x80010000`, so on the
//! wire it is real RoCEv2 CM traffic that tshark decodes and rxe's CM would accept. The sender
//! is identified by the source GID in the receive's GRH area.
//!
//! On an InfiniBand port a MAD inside the subnet has no GRH: it goes to the peer's LID (from
//! its PathRecord, [`MadTransport::set_peer_lid`](super::MadTransport::set_peer_lid)), and a
//! received one names its sender by its SLID, whose GID is the one a PathRecord or an earlier
//! REQ gave (a REQ names its sender's GID and LID in its primary path). At most
//! [`MAX_PEER_LIDS`] peers are known by LID.
use super::{MadStats, MAD_LEN};
use crate::verbs::setup::open_ud_qp;
use crate::verbs::{
    AddressVector, BufId, Completion, CqId, Gid, Lid, PdId, PoolId, QKey, QpNum, QpType, SendWr,
    Sl, UdDest, Verbs, VerbsError, WcOpcode, WcStatus, WrId,
};
use crate::wire::cm::{CmMad, CmMessage};
use crate::wire::grh::{grh_source_gid, GRH_LEN};
use std::collections::BTreeMap;

/// Receives posted on QP1 by [`Gsi::open_for_cm`]: deep enough for a burst of REQs from many
/// peers at once (a dropped MAD costs a CM retransmission timeout).
pub const GSI_RECV_DEPTH: u32 = 1024;
/// MADs in flight on QP1 opened by [`Gsi::open_for_cm`].
pub const GSI_SEND_DEPTH: u32 = 256;

/// Bytes of the buffer pool of QP1 opened with `recv_depth` receives and `send_depth` sends
/// ([`Gsi::open`]): one GRH and MAD each.
pub const fn gsi_pool_bytes(recv_depth: u32, send_depth: u32) -> usize {
    (recv_depth + send_depth) as usize * GSI_BUF_LEN
}

/// Bytes of one QP1 buffer: a receive's GRH area and a MAD.
const GSI_BUF_LEN: usize = GRH_LEN + MAD_LEN;

/// Most peers known by LID (InfiniBand); the lowest GID goes first when more come.
pub const MAX_PEER_LIDS: usize = 4096;

/// QP1 with its own CQ and buffer pool.
#[derive(Debug)]
pub struct Gsi {
    qp: QpNum,
    cq: CqId,
    free_send: Vec<BufId>,
    stats: MadStats,
    wcs: Vec<Completion>,
    /// InfiniBand: the LID of each peer, and the last route a MAD of each came by.
    lids: BTreeMap<Gid, Lid>,
}

const RECV_WRID: WrId = WrId(1);
const SEND_WRID: WrId = WrId(2);

impl Gsi {
    /// Opens QP1 for the CM of an endpoint on `v`, on a protection domain of its own, with
    /// [`GSI_RECV_DEPTH`] receives and [`GSI_SEND_DEPTH`] sends.
    ///
    /// # Errors
    /// Any verbs error of the set-up.
    pub fn open_for_cm<V: Verbs>(v: &mut V) -> Result<Self, VerbsError> {
        let pd = v.alloc_pd()?;
        Self::open(v, pd, GSI_RECV_DEPTH, GSI_SEND_DEPTH)
    }

    /// Creates QP1, brings it to RTS, and posts `recv_depth` receives; `send_depth` MADs may be
    /// in flight at once.
    ///
    /// # Errors
    /// Any verbs error of the set-up.
    pub fn open<V: Verbs>(
        v: &mut V,
        pd: PdId,
        recv_depth: u32,
        send_depth: u32,
    ) -> Result<Self, VerbsError> {
        let cq = v.create_cq(recv_depth + send_depth)?;
        let pool: PoolId = v.create_pool(pd, GSI_BUF_LEN, (recv_depth + send_depth) as usize)?;
        let setup = open_ud_qp(
            v,
            pd,
            QpType::Gsi,
            cq,
            pool,
            QKey::GSI,
            0,
            recv_depth,
            send_depth,
            RECV_WRID,
        )?;
        let (qp, free_send) = (setup.qp, setup.send_bufs);
        Ok(Self {
            qp,
            cq,
            free_send,
            stats: MadStats::default(),
            wcs: Vec::with_capacity(64),
            lids: BTreeMap::new(),
        })
    }

    /// True when a send buffer is free (a [`Gsi::send`] now would not be dropped).
    pub fn can_send(&self) -> bool {
        !self.free_send.is_empty()
    }

    /// The QP number (QP 1).
    pub fn qp(&self) -> QpNum {
        self.qp
    }

    /// Counters.
    pub fn stats(&self) -> MadStats {
        self.stats
    }

    /// Sends one MAD to QP1 at `to`. A MAD that finds no free send buffer is dropped and
    /// counted (the CM retransmits).
    ///
    /// # Errors
    /// A verbs error of the post.
    pub fn send<V: Verbs>(
        &mut self,
        v: &mut V,
        to: Gid,
        mad: &[u8; MAD_LEN],
    ) -> Result<(), VerbsError> {
        let Some(b) = self.free_send.pop() else {
            self.stats.send_dropped += 1;
            return Ok(());
        };
        match v.pools_mut().get_mut(b) {
            Ok(buf) => match buf.get_mut(..MAD_LEN) {
                Some(dst) => dst.copy_from_slice(mad),
                None => {
                    return Err(VerbsError::TooLong {
                        len: MAD_LEN,
                        limit: buf.len(),
                    })
                }
            },
            Err(e) => {
                self.free_send.push(b);
                return Err(e);
            }
        }
        let mut wr = SendWr::send(SEND_WRID, b, MAD_LEN);
        let av = match self.lids.get(&to) {
            Some(&lid) => AddressVector::to_lid(lid, Sl::ZERO),
            None => AddressVector::to_gid(to),
        };
        wr.ud = Some(UdDest {
            av,
            remote_qpn: QpNum::GSI,
            remote_qkey: QKey::GSI,
        });
        if let Err(e) = v.post_send(self.qp, &wr) {
            self.free_send.push(b);
            return Err(e);
        }
        self.stats.sent += 1;
        Ok(())
    }

    /// Reaps completions: send buffers return to the free list, received MADs are appended to
    /// `out` with their sender's GID and the receive is posted again.
    pub fn poll<V: Verbs>(&mut self, v: &mut V, out: &mut Vec<(Gid, [u8; MAD_LEN])>) {
        for _ in 0..64 {
            self.wcs.clear();
            if v.poll_cq(self.cq, &mut self.wcs, 64) == 0 {
                break;
            }
            for wc in std::mem::take(&mut self.wcs) {
                let Some(b) = wc.buf else { continue };
                if wc.status != WcStatus::Success {
                    self.stats.errors += 1;
                }
                match wc.opcode {
                    WcOpcode::Send => self.free_send.push(b),
                    WcOpcode::Recv => {
                        if wc.status == WcStatus::Success {
                            let from = if wc.grh { None } else { wc.slid };
                            self.take_mad(v, b, wc.byte_len as usize, from, out);
                        }
                        if v.post_recv(self.qp, RECV_WRID, b).is_err() {
                            let _ = v.pools_mut().free(b);
                        }
                    }
                }
            }
        }
    }

    /// Takes a received MAD from its buffer: its sender by the GRH's source GID, or (`slid`,
    /// no GRH) by the GID known for that LID.
    fn take_mad<V: Verbs>(
        &mut self,
        v: &V,
        b: BufId,
        len: usize,
        slid: Option<Lid>,
        out: &mut Vec<(Gid, [u8; MAD_LEN])>,
    ) {
        let parsed = v.pools().get(b).ok().and_then(|buf| {
            let mad: [u8; MAD_LEN] = buf.get(GRH_LEN..len)?.get(..MAD_LEN)?.try_into().ok()?;
            let from = match slid {
                None => grh_source_gid(buf)?,
                Some(lid) => self.gid_of(lid, &mad)?,
            };
            Some((from, mad))
        });
        match parsed {
            Some(m) => {
                self.stats.received += 1;
                out.push(m);
            }
            None => self.stats.recv_malformed += 1,
        }
    }
}

impl Gsi {
    /// InfiniBand: the peer at `gid` is at `lid`.
    pub fn set_peer_lid(&mut self, gid: Gid, lid: Lid) {
        if !self.lids.contains_key(&gid) && self.lids.len() >= MAX_PEER_LIDS {
            self.lids.pop_first();
        }
        self.lids.insert(gid, lid);
    }

    /// The LID a peer is known at (InfiniBand).
    pub fn peer_lid(&self, gid: Gid) -> Option<Lid> {
        self.lids.get(&gid).copied()
    }

    /// The GID of the peer at `lid`: one known already, or the sender a REQ names in its
    /// primary path (its local GID and LID), learnt then.
    fn gid_of(&mut self, lid: Lid, mad: &[u8; MAD_LEN]) -> Option<Gid> {
        if let Some((&g, _)) = self.lids.iter().find(|(_, l)| **l == lid) {
            return Some(g);
        }
        let CmMessage::Req(r) = CmMad::parse(mad).ok()?.msg else {
            return None;
        };
        let p = r.primary_path;
        (Lid(p.local_lid) == lid).then_some(())?;
        self.set_peer_lid(p.local_gid, lid);
        Some(p.local_gid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::Fabric;
    use std::time::Duration;

    #[test]
    fn mads_cross_the_fabric_on_qp1() {
        let mut f = Fabric::with_nodes(2, std::time::Instant::now(), |_, _| {});
        let mut gsi = Vec::new();
        for n in &mut f.nodes {
            let pd = n.alloc_pd().unwrap();
            gsi.push(Gsi::open(n, pd, 8, 4).unwrap());
        }
        let to = f.nodes[1].port_attr().gid;
        let from = f.nodes[0].port_attr().gid;
        let mut mad = [0u8; MAD_LEN];
        mad[0] = 1;
        mad[1] = 7;
        mad[255] = 0xAB;
        for _ in 0..3 {
            gsi[0].send(&mut f.nodes[0], to, &mad).unwrap();
        }
        f.run_idle(1000, Duration::from_secs(1));
        let mut got = Vec::new();
        gsi[1].poll(&mut f.nodes[1], &mut got);
        assert_eq!(got.len(), 3);
        assert!(got.iter().all(|(g, m)| *g == from && *m == mad));
        let mut none = Vec::new();
        gsi[0].poll(&mut f.nodes[0], &mut none);
        assert!(none.is_empty());
        assert_eq!(gsi[0].stats().sent, 3);
        assert_eq!(f.nodes[1].stats().rx_bad_qkey, 0);
        // Send buffers came back: 4 more sends fit.
        for _ in 0..4 {
            gsi[0].send(&mut f.nodes[0], to, &mad).unwrap();
        }
        assert_eq!(gsi[0].stats().send_dropped, 0);
    }
}
