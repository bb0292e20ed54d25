//! [`ConnectionManager`]: which CM runs the endpoint's connections, behind one set of calls,
//! so that the connection tables do not know.
//!
//! - [`ConnectionManager::Ours`]: our [`Cm`], whose MADs travel over the driver's
//!   [`MadTransport`](crate::mad::MadTransport);
//! - [`ConnectionManager::Kernel`]: the kernel's `ib_cm` through librdmacm, as the sans-IO
//!   [`KernelCm`] whose commands the driver executes on `hw::rdmacm::RdmaCm`.
//!
//! Both take `connect`, `accept`, `reject`, `rtu`, `disconnect` and hand out the same
//! [`CmEvent`]s.

use std::time::Instant;

use super::kernel::{KcmCommand, KcmInput, KernelCm, QpMoves};
use super::{AcceptParams, Cm, CmEvent, CmState, CmStats, CmUseError, CommId, ConnectParams};
use crate::verbs::Gid;
use crate::wire::cm::{RejReason, MAD_LEN};

/// The CM of the endpoint's connections: our [`Cm`] or the kernel's ([`KernelCm`]).
// One per endpoint, never moved after set-up: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum ConnectionManager {
    /// Our CM, over a MAD transport.
    Ours(Cm),
    /// The kernel's CM, through the driver.
    Kernel(KernelCm),
}

impl ConnectionManager {
    /// Starts a connection for our QP.
    ///
    /// # Errors
    /// The CM's [`CmUseError`].
    pub fn connect(&mut self, now: Instant, p: ConnectParams) -> Result<CommId, CmUseError> {
        match self {
            Self::Ours(c) => c.connect(now, p),
            Self::Kernel(k) => k.connect(now, p),
        }
    }

    /// Accepts a request.
    ///
    /// # Errors
    /// The CM's [`CmUseError`].
    pub fn accept(&mut self, now: Instant, id: CommId, p: AcceptParams) -> Result<(), CmUseError> {
        match self {
            Self::Ours(c) => c.accept(now, id, p),
            Self::Kernel(k) => k.accept(now, id, p),
        }
    }

    /// Rejects a request or a response.
    ///
    /// # Errors
    /// The CM's [`CmUseError`].
    pub fn reject(
        &mut self,
        now: Instant,
        id: CommId,
        reason: RejReason,
    ) -> Result<(), CmUseError> {
        match self {
            Self::Ours(c) => c.reject(now, id, reason),
            Self::Kernel(k) => k.reject(now, id, reason),
        }
    }

    /// Refuses a request whose path MTU is above `acceptable`: our CM sends REJ
    /// [`RejReason::InvalidMtu`] naming `acceptable` in its ARI ([`Cm::reject_mtu`]); the
    /// kernel's can only send REJ Consumer Defined, which names no MTU.
    ///
    /// # Errors
    /// The CM's [`CmUseError`].
    pub fn reject_mtu(
        &mut self,
        now: Instant,
        id: CommId,
        acceptable: crate::verbs::PathMtu,
    ) -> Result<(), CmUseError> {
        match self {
            Self::Ours(c) => c.reject_mtu(now, id, acceptable),
            Self::Kernel(k) => k.reject(now, id, RejReason::InvalidMtu),
        }
    }

    /// Sends the RTU.
    ///
    /// # Errors
    /// The CM's [`CmUseError`].
    pub fn rtu(&mut self, now: Instant, id: CommId) -> Result<(), CmUseError> {
        match self {
            Self::Ours(c) => c.rtu(now, id),
            Self::Kernel(k) => k.rtu(now, id),
        }
    }

    /// The passive QP received before the RTU.
    pub fn notify_comm_est(&mut self, now: Instant, id: CommId) {
        match self {
            Self::Ours(c) => c.notify_comm_est(now, id),
            Self::Kernel(k) => k.notify_comm_est(now, id),
        }
    }

    /// Ends a connection (DREQ, or REJ before it is established).
    ///
    /// # Errors
    /// The CM's [`CmUseError`].
    pub fn disconnect(&mut self, now: Instant, id: CommId) -> Result<(), CmUseError> {
        match self {
            Self::Ours(c) => c.disconnect(now, id),
            Self::Kernel(k) => k.disconnect(now, id),
        }
    }

    /// The state of a live id; `None` once it is gone.
    #[must_use]
    pub fn state(&self, id: CommId) -> Option<CmState> {
        match self {
            Self::Ours(c) => c.state(id),
            Self::Kernel(k) => k.state(id),
        }
    }

    /// The next event for the endpoint.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        match self {
            Self::Ours(c) => c.poll_event(),
            Self::Kernel(k) => k.poll_event(),
        }
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> CmStats {
        match self {
            Self::Ours(c) => c.stats(),
            Self::Kernel(k) => k.stats(),
        }
    }

    /// Our CM's deadline (the kernel's CM keeps its own).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Self::Ours(c) => c.poll_timeout(),
            Self::Kernel(_) => None,
        }
    }

    /// Our CM's retransmissions and TimeWait (the kernel's CM runs its own).
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Self::Ours(c) = self {
            c.handle_timeout(now);
        }
    }

    /// A MAD for our CM, with the LIDs it came by where the port has them (the kernel's CM
    /// reads its own: dropped).
    pub fn handle_routed_mad(
        &mut self,
        now: Instant,
        from: Gid,
        route: Option<super::MadRoute>,
        mad: &[u8; MAD_LEN],
    ) {
        if let Self::Ours(c) = self {
            c.handle_routed_mad(now, from, route, mad);
        }
    }

    /// True while our CM's MADs wait for the transport.
    #[must_use]
    pub fn has_transmit(&self) -> bool {
        matches!(self, Self::Ours(c) if c.has_transmit())
    }

    /// Our CM's next MAD.
    pub fn poll_transmit(&mut self) -> Option<(Gid, [u8; MAD_LEN])> {
        match self {
            Self::Ours(c) => c.poll_transmit(),
            Self::Kernel(_) => None,
        }
    }

    /// The kernel's QP moves for a request or response (`None` on our CM: the endpoint moves
    /// its QP from the REQ's or REP's fields).
    #[must_use]
    pub fn qp_moves(&self, id: CommId) -> Option<QpMoves> {
        match self {
            Self::Ours(_) => None,
            Self::Kernel(k) => k.qp_moves(id),
        }
    }

    /// The next command for the driver's kernel CM (none on ours).
    pub fn poll_command(&mut self) -> Option<KcmCommand> {
        match self {
            Self::Ours(_) => None,
            Self::Kernel(k) => k.poll_command(),
        }
    }

    /// What the driver read from the kernel's CM (ignored on ours).
    pub fn handle_input(&mut self, now: Instant, input: KcmInput) {
        if let Self::Kernel(k) = self {
            k.handle_input(now, input);
        }
    }

    /// Live ids.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            Self::Ours(c) => c.len(),
            Self::Kernel(k) => k.len(),
        }
    }

    /// True when no id is live.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True for the kernel's CM.
    #[must_use]
    pub const fn is_kernel(&self) -> bool {
        matches!(self, Self::Kernel(_))
    }
}
