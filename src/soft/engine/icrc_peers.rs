//! [`IdSolvedPeers`]: the peers whose IPv4 ICRCs checked only with a nonzero IP ID outside
//! our own senders' GSO span (a sender that picks its own IDs, such as Linux `rdma_rxe`), so
//! that whoever logs can say so once per peer.

use std::net::IpAddr;

/// The set of such peers seen, and those not yet taken, both bounded by [`Self::CAP`]; a peer
/// past the cap is not remembered (counted in `SoftStats::icrc_id_peers_untracked`).
#[derive(Debug, Default)]
pub(super) struct IdSolvedPeers {
    /// Every peer seen, in arrival order; at most [`Self::CAP`].
    seen: Vec<IpAddr>,
    /// How many of `seen` (its tail) have not been taken yet.
    untaken: usize,
}

/// What [`IdSolvedPeers::note`] made of a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Noted {
    /// Seen for the first time: it will be handed out once.
    New,
    /// Already seen.
    Known,
    /// Not remembered: the set is full.
    Untracked,
}

impl IdSolvedPeers {
    /// Peers remembered (arrival is wire input: a bounded set).
    pub(super) const CAP: usize = 64;

    /// Records that `peer`'s ICRC checked only with a foreign ID.
    pub(super) fn note(&mut self, peer: IpAddr) -> Noted {
        if self.seen.contains(&peer) {
            Noted::Known
        } else if self.seen.len() >= Self::CAP {
            Noted::Untracked
        } else {
            self.seen.push(peer);
            self.untaken += 1;
            Noted::New
        }
    }

    /// The peers seen since the last call, oldest first; each is handed out once.
    pub(super) fn take(&mut self) -> Vec<IpAddr> {
        let start = self.seen.len().saturating_sub(self.untaken);
        self.untaken = 0;
        self.seen.get(start..).unwrap_or_default().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn each_peer_is_handed_out_once_and_the_set_is_bounded() {
        let mut p = IdSolvedPeers::default();
        let a = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
        let b = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(p.note(a), Noted::New);
        assert_eq!(p.note(a), Noted::Known);
        assert_eq!(p.take(), vec![a]);
        assert_eq!(p.take(), Vec::<IpAddr>::new());
        assert_eq!(p.note(a), Noted::Known);
        assert_eq!(p.note(b), Noted::New);
        assert_eq!(p.take(), vec![b]);
        for i in 0..200u32 {
            let ip = IpAddr::V4(Ipv4Addr::from(0xC612_0100 + i));
            let _ = p.note(ip);
        }
        assert_eq!(p.seen.len(), IdSolvedPeers::CAP);
        assert_eq!(p.take().len(), IdSolvedPeers::CAP - 2);
        assert_eq!(
            p.note(IpAddr::V4(Ipv4Addr::new(198, 19, 0, 1))),
            Noted::Untracked
        );
        assert_eq!(p.note(a), Noted::Known);
    }
}
