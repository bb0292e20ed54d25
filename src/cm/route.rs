//! Which worker a CM MAD is for, when the interface's connections are spread over workers.
//!
//! One CM transport (QP1, umad, the UDP side channel) carries the MADs of every worker's
//! connections; the control side that reads it hands each MAD to the worker whose [`Cm`]
//! holds the connection, found from the MAD alone:
//!
//! - a REQ opens a new connection: it goes to the worker in the low bits of the sender's QPN
//!   (an ipoib-cm sender with as many workers tags its QPNs the same way, so both directions
//!   of a flow stay on one worker each side; any other sender's QPNs spread its REQs). The
//!   same REQ sent again goes to the same worker, which recognises it as a duplicate;
//! - every other message names our id as its Remote Communication ID, whose low bits are its
//!   worker's ([`CmConfig::comm_id_slot`](super::CmConfig::comm_id_slot));
//! - a MAD that does not parse goes to worker 0, whose CM counts it as malformed.
//!
//! [`Cm`]: super::Cm

use crate::wire::cm::{CmMad, CmMessage};
use crate::wire::WorkerCount;

/// The worker of `workers` that `mad` (a whole CM MAD as received) is for.
pub fn mad_owner(mad: &[u8], workers: WorkerCount) -> u8 {
    let Ok(m) = CmMad::parse(mad) else {
        return 0;
    };
    let ours = match m.msg {
        CmMessage::Req(r) => return workers.owner_of_qpn(r.local_qpn),
        CmMessage::Mra(r) => r.remote_comm_id,
        CmMessage::Rej(r) => r.remote_comm_id,
        CmMessage::Rep(r) => r.remote_comm_id,
        CmMessage::Rtu(r) => r.remote_comm_id,
        CmMessage::Dreq(r) => r.remote_comm_id,
        CmMessage::Drep(r) => r.remote_comm_id,
    };
    workers.owner(ours)
}
