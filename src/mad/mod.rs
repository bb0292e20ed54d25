//! CM MAD transports: how the 256-byte CM MADs of the [`crate::cm`] state machine reach the
//! peer's CM and come back.
//!
//! The endpoint owns no transport: it takes received MADs in
//! ([`Endpoint::handle_mad`](crate::ipoib::Endpoint::handle_mad)) and hands MADs to send out
//! ([`Endpoint::poll_mad`](crate::ipoib::Endpoint::poll_mad)). The driver opens the transport
//! that [`CmTransport`] names, registers whatever file descriptor it has with its event loop,
//! and moves MADs both ways on every turn through the [`MadTransport`] trait:
//!
//! - [`Gsi`] (`qp1`): UD sends to QP 1 over the provider's verbs, where the provider lets the
//!   caller own QP1 (the software provider does);
//! - [`MadUdp`] (`udp`): one UDP datagram per MAD beside the provider, for kernel verbs, whose
//!   QP1 the kernel owns;
//! - [`Umad`] (`umad`): the kernel's own QP1 through `/dev/infiniband/umadN`, for kernel verbs
//!   on a host whose kernel runs no CM (`ib_cm` not loaded).

mod qp1;
mod udp;
mod umad;

use std::io;
use std::os::fd::RawFd;
use std::str::FromStr;

use crate::choice::ParseChoiceError;
use crate::cm::MadRoute;
use crate::verbs::{Gid, QpNum, Verbs, VerbsError};

pub use crate::wire::cm::MAD_LEN;
pub use qp1::{gsi_pool_bytes, Gsi, GSI_RECV_DEPTH, GSI_SEND_DEPTH, MAX_PEER_LIDS};
pub use udp::{MadUdp, DEFAULT_MAD_PORT};
pub use umad::{
    Umad, UmadConfig, UmadError, CM_CLASS_VERSION, CM_METHOD_SEND, CM_MGMT_CLASS, PEER_LID_CAP,
    UMAD_BATCH, UMAD_HOP_LIMIT,
};

/// How CM MADs travel (`--cm-transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmTransport {
    /// UD sends to QP1 ([`Gsi`]; the software provider owns QP1).
    Qp1,
    /// The UDP side channel ([`MadUdp`]; kernel verbs, whose QP1 the kernel owns).
    Udp,
    /// The kernel's QP1 through umad ([`Umad`]; kernel verbs, no `ib_cm` loaded).
    Umad,
    /// No MADs of ours: the kernel's CM through librdmacm (kernel verbs; docs/kernel-cm.md).
    RdmaCm,
}

impl FromStr for CmTransport {
    type Err = ParseChoiceError;
    fn from_str(s: &str) -> Result<Self, ParseChoiceError> {
        match s {
            "qp1" => Ok(Self::Qp1),
            "udp" => Ok(Self::Udp),
            "umad" => Ok(Self::Umad),
            "rdmacm" => Ok(Self::RdmaCm),
            _ => Err(ParseChoiceError::new(
                "\"qp1\", \"udp\", \"umad\" or \"rdmacm\"",
                s,
            )),
        }
    }
}

impl CmTransport {
    /// The name `--cm-transport` takes (start-up line, status).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Qp1 => "qp1",
            Self::Udp => "udp",
            Self::Umad => "umad",
            Self::RdmaCm => "rdmacm",
        }
    }
}

/// No MAD transport: the kernel's CM carries its own MADs ([`CmTransport::RdmaCm`]).
#[derive(Debug, Default)]
pub struct NoMads;

impl<V: Verbs> MadTransport<V> for NoMads {
    fn can_send(&self) -> bool {
        false
    }

    fn send(&mut self, _: &mut V, _: Gid, _: &[u8; MAD_LEN]) -> Result<(), MadSendError> {
        Ok(())
    }

    fn poll(&mut self, _: &mut V, _: &mut Vec<Mad>) {}

    fn stats(&self) -> MadStats {
        MadStats::default()
    }

    fn provider_qp(&self) -> Option<QpNum> {
        None
    }
}

/// Counters of a MAD transport (the same meaning for every one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MadStats {
    /// MADs posted for sending.
    pub sent: u64,
    /// MADs received.
    pub received: u64,
    /// Sends refused because every send buffer was in flight (or the socket would block).
    pub send_dropped: u64,
    /// Receives that were not a whole MAD or had no usable sender address.
    pub recv_malformed: u64,
    /// Completions with an error status, or socket errors.
    pub errors: u64,
}

/// Why a MAD could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum MadSendError {
    /// The QP1 post failed.
    #[error("{0}")]
    Verbs(#[source] VerbsError),
    /// The UDP send failed.
    #[error("{0}")]
    Io(#[source] io::Error),
}

/// A received MAD with its sender, or a MAD to send with its destination.
pub type Mad = (Gid, [u8; MAD_LEN]);

/// One way of carrying CM MADs, driven by the driver over the provider `V`.
///
/// Object safe, so a driver that picks the transport at run time may hold a
/// `Box<dyn MadTransport<V>>`.
pub trait MadTransport<V: Verbs> {
    /// True when a MAD can be sent now without being dropped for lack of a send buffer.
    fn can_send(&self) -> bool;

    /// Sends one MAD to `to`. A MAD that finds no send buffer (or a socket that would block)
    /// is dropped and counted: the CM retransmits.
    ///
    /// # Errors
    /// The transport's error.
    fn send(&mut self, v: &mut V, to: Gid, mad: &[u8; MAD_LEN]) -> Result<(), MadSendError>;

    /// Appends every MAD received since the last call to `out`, with its sender.
    fn poll(&mut self, v: &mut V, out: &mut Vec<Mad>);

    /// Counters.
    fn stats(&self) -> MadStats;

    /// The QP this transport holds on the provider (QP1), if it holds one: the endpoint
    /// counts it with its own QPs.
    fn provider_qp(&self) -> Option<QpNum>;

    /// A descriptor of its own that becomes readable when a MAD arrives, for the driver to
    /// register with its event loop (QP1 on the provider has none: the provider's own
    /// completion descriptor wakes the loop).
    fn readiness_fd(&self) -> Option<RawFd> {
        None
    }

    /// InfiniBand: the peer at `gid` is reached at `lid` (from its PathRecord). Transports
    /// that address peers by GID alone ignore it.
    fn set_peer_lid(&mut self, _gid: Gid, _lid: u16) {}

    /// InfiniBand: how MADs from `from` reach this port (its LID), for a passive side's path
    /// from a REQ ([`crate::cm::passive_path`]); `None` where the transport knows no LIDs.
    fn route_of(&self, _from: Gid) -> Option<MadRoute> {
        None
    }

    /// True when the last [`MadTransport::poll`] stopped at its bound with MADs left: the
    /// next turn should follow at once.
    fn has_more(&self) -> bool {
        false
    }

    /// True once the transport learnt that its device is being removed (a umad read that
    /// failed with `EIO`): the node must let go of the device.
    fn device_gone(&self) -> bool {
        false
    }
}

impl<V: Verbs> MadTransport<V> for Gsi {
    fn can_send(&self) -> bool {
        Self::can_send(self)
    }

    fn send(&mut self, v: &mut V, to: Gid, mad: &[u8; MAD_LEN]) -> Result<(), MadSendError> {
        Self::send(self, v, to, mad).map_err(MadSendError::Verbs)
    }

    fn poll(&mut self, v: &mut V, out: &mut Vec<Mad>) {
        Self::poll(self, v, out);
    }

    fn stats(&self) -> MadStats {
        Self::stats(self)
    }

    fn provider_qp(&self) -> Option<QpNum> {
        Some(self.qp())
    }

    fn set_peer_lid(&mut self, gid: Gid, lid: u16) {
        Self::set_peer_lid(self, gid, crate::verbs::Lid(lid));
    }

    fn route_of(&self, from: Gid) -> Option<MadRoute> {
        self.peer_lid(from).map(|slid| MadRoute {
            slid,
            sl: crate::verbs::Sl::ZERO,
            dlid_path_bits: 0,
            grh: false,
        })
    }
}

/// [`MadTransport`] for a transport that owns a descriptor of its own and no provider QP
/// (its inherent `send`, `poll`, `stats`, `readiness_fd` and `has_more` do the work).
macro_rules! fd_transport {
    ($t:ty { $($extra:tt)* }) => {
        impl<V: Verbs> MadTransport<V> for $t {
            fn can_send(&self) -> bool {
                true
            }

            fn send(
                &mut self,
                _: &mut V,
                to: Gid,
                mad: &[u8; MAD_LEN],
            ) -> Result<(), MadSendError> {
                Self::send(self, to, mad).map_err(MadSendError::Io)
            }

            fn poll(&mut self, _: &mut V, out: &mut Vec<Mad>) {
                Self::poll(self, out);
            }

            fn stats(&self) -> MadStats {
                Self::stats(self)
            }

            fn provider_qp(&self) -> Option<QpNum> {
                None
            }

            fn readiness_fd(&self) -> Option<RawFd> {
                Some(Self::readiness_fd(self))
            }

            fn has_more(&self) -> bool {
                Self::has_more(self)
            }

            $($extra)*
        }
    };
}
fd_transport!(MadUdp {});
fd_transport!(Umad {
    fn device_gone(&self) -> bool {
        Self::device_gone(self)
    }

    fn set_peer_lid(&mut self, gid: Gid, lid: u16) {
        if !Self::set_peer_lid(self, gid, lid) {
            tracing::debug!(peer = %gid, lid, "umad: peer LID table full; its MADs are not sent");
        }
    }
});

/// Counts the outcome of one send on a descriptor: sent, dropped when `dropped` says the
/// kernel had no room (the CM retransmits), or an error (returned).
fn count_send(
    stats: &mut MadStats,
    r: io::Result<()>,
    dropped: impl Fn(&io::Error) -> bool,
) -> io::Result<()> {
    match r {
        Ok(()) => {
            stats.sent += 1;
            Ok(())
        }
        Err(e) if dropped(&e) => {
            stats.send_dropped += 1;
            Ok(())
        }
        Err(e) => {
            stats.errors += 1;
            Err(e)
        }
    }
}

/// Sends what `next` yields (the endpoint's [`poll_mad`](crate::ipoib::Endpoint::poll_mad))
/// while the transport has room; what does not fit stays with the caller for the next turn
/// (the endpoint then asks for an immediate turn), instead of being dropped and costing the
/// peer a CM retransmission timeout.
pub fn send_while_room<V: Verbs, T: MadTransport<V> + ?Sized>(
    t: &mut T,
    v: &mut V,
    mut next: impl FnMut() -> Option<Mad>,
) {
    while t.can_send() {
        let Some((to, mad)) = next() else {
            break;
        };
        if let Err(e) = t.send(v, to, &mad) {
            tracing::warn!(error = %e, "sending a CM MAD failed (the CM retransmits)");
        }
    }
}

/// Reads what the transport received and hands each MAD, with its route where the transport
/// knows one, to `deliver` (the endpoint's
/// [`handle_routed_mad`](crate::ipoib::Endpoint::handle_routed_mad)); `scratch` is reused
/// across turns.
pub fn receive<V: Verbs, T: MadTransport<V> + ?Sized>(
    t: &mut T,
    v: &mut V,
    scratch: &mut Vec<Mad>,
    mut deliver: impl FnMut(Gid, Option<MadRoute>, &[u8; MAD_LEN]),
) {
    scratch.clear();
    t.poll(v, scratch);
    for (from, mad) in scratch.iter() {
        deliver(*from, t.route_of(*from), mad);
    }
    scratch.clear();
    scratch.shrink_to(crate::cm::QUEUE_KEEP);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soft::{SoftConfig, SoftVerbs};
    use std::net::{IpAddr, Ipv4Addr};

    /// A transport with room for `room` MADs that records what it sends.
    struct Recorder {
        room: usize,
        sent: Vec<Mad>,
    }

    impl<V: Verbs> MadTransport<V> for Recorder {
        fn can_send(&self) -> bool {
            self.sent.len() < self.room
        }
        fn send(&mut self, _: &mut V, to: Gid, mad: &[u8; MAD_LEN]) -> Result<(), MadSendError> {
            self.sent.push((to, *mad));
            Ok(())
        }
        fn poll(&mut self, _: &mut V, out: &mut Vec<Mad>) {
            out.append(&mut self.sent);
        }
        fn stats(&self) -> MadStats {
            MadStats::default()
        }
        fn provider_qp(&self) -> Option<QpNum> {
            None
        }
    }

    #[test]
    fn what_the_transport_has_no_room_for_stays_with_the_caller() {
        let mut v = SoftVerbs::new(SoftConfig::new(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let mut queue: std::collections::VecDeque<Mad> = (0..5u8)
            .map(|i| (Gid::from_ip(IpAddr::V4(Ipv4Addr::LOCALHOST)), [i; MAD_LEN]))
            .collect();
        let mut t = Recorder {
            room: 2,
            sent: Vec::new(),
        };
        let dyn_t: &mut dyn MadTransport<SoftVerbs> = &mut t;
        send_while_room(dyn_t, &mut v, || queue.pop_front());
        assert_eq!(queue.len(), 3);
        let mut scratch = Vec::new();
        let mut got = Vec::new();
        receive(&mut t, &mut v, &mut scratch, |_, _, m| got.push(m[0]));
        assert_eq!(got, [0, 1]);
        assert!(scratch.is_empty());
    }

    #[test]
    fn the_transport_choice_parses_from_its_names() {
        assert_eq!("qp1".parse::<CmTransport>(), Ok(CmTransport::Qp1));
        assert_eq!("udp".parse::<CmTransport>(), Ok(CmTransport::Udp));
        assert_eq!("umad".parse::<CmTransport>(), Ok(CmTransport::Umad));
        assert_eq!("rdmacm".parse::<CmTransport>(), Ok(CmTransport::RdmaCm));
        assert_eq!(CmTransport::RdmaCm.as_str(), "rdmacm");
        assert_eq!(CmTransport::Umad.as_str(), "umad");
        assert!("rdma".parse::<CmTransport>().is_err());
    }
}
