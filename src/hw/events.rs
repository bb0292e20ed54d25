//! Asynchronous events: read from the device's non-blocking async fd, translated to
//! [`AsyncEvent`] and acked one by one.

use super::context::HwVerbs;
use crate::verbs::{AsyncEvent, CqId, QpNum, SrqId};
use ibverbs_sys as ffi;

impl HwVerbs {
    /// Reads every pending async event and queues it.
    pub(super) fn drain_async(&mut self) {
        if self.ctx.is_null() {
            return;
        }
        loop {
            // SAFETY: ibv_async_event is plain C data; all-zero is valid.
            let mut ev: ffi::ibv_async_event = unsafe { std::mem::zeroed() };
            self.stats.calls.async_fd_reads += 1;
            // SAFETY: valid context (non-blocking async fd) and out pointer.
            if unsafe { ffi::ibv_get_async_event(self.ctx, &mut ev) } != 0 {
                break;
            }
            let t = ev.event_type;
            // SAFETY: the element union is read according to the event type, as documented
            // for `ibv_get_async_event`; the QP/SRQ is live until the event is acked.
            let qpn = |ev: &ffi::ibv_async_event| unsafe { QpNum::new((*ev.element.qp).qp_num) };
            let out = match t {
                ffi::IBV_EVENT_QP_LAST_WQE_REACHED => Some(AsyncEvent::QpLastWqeReached(qpn(&ev))),
                ffi::IBV_EVENT_QP_FATAL => Some(AsyncEvent::QpFatal(qpn(&ev))),
                ffi::IBV_EVENT_QP_REQ_ERR => Some(AsyncEvent::QpReqErr(qpn(&ev))),
                ffi::IBV_EVENT_QP_ACCESS_ERR => Some(AsyncEvent::QpAccessErr(qpn(&ev))),
                ffi::IBV_EVENT_COMM_EST => Some(AsyncEvent::CommEst(qpn(&ev))),
                ffi::IBV_EVENT_SQ_DRAINED => Some(AsyncEvent::SqDrained(qpn(&ev))),
                ffi::IBV_EVENT_SRQ_LIMIT_REACHED => {
                    self.srq_of(&ev).map(AsyncEvent::SrqLimitReached)
                }
                ffi::IBV_EVENT_SRQ_ERR => self.srq_of(&ev).map(AsyncEvent::SrqErr),
                ffi::IBV_EVENT_CQ_ERR => {
                    // SAFETY: as above, a CQ event names a CQ.
                    let raw = unsafe { ev.element.cq };
                    self.cqs
                        .iter()
                        .find(|(_, c)| c.raw == raw)
                        .map(|(id, _)| AsyncEvent::CqErr(CqId(*id)))
                }
                ffi::IBV_EVENT_DEVICE_FATAL => Some(AsyncEvent::DeviceFatal),
                ffi::IBV_EVENT_GID_CHANGE => Some(AsyncEvent::GidChange),
                ffi::IBV_EVENT_PORT_ACTIVE => Some(AsyncEvent::PortActive),
                ffi::IBV_EVENT_PORT_ERR => Some(AsyncEvent::PortErr),
                ffi::IBV_EVENT_LID_CHANGE => Some(AsyncEvent::LidChange),
                ffi::IBV_EVENT_PKEY_CHANGE => Some(AsyncEvent::PkeyChange),
                ffi::IBV_EVENT_SM_CHANGE => Some(AsyncEvent::SmChange),
                ffi::IBV_EVENT_CLIENT_REREGISTER => Some(AsyncEvent::ClientReregister),
                _ => None,
            };
            // SAFETY: every event from ibv_get_async_event is acked exactly once.
            unsafe { ffi::ibv_ack_async_event(&mut ev) };
            self.stats.async_events += 1;
            match out {
                Some(e) => self.events.push_back(e),
                None => {
                    self.stats.async_unhandled += 1;
                    tracing::debug!(event = t, "unhandled async event");
                }
            }
        }
    }

    /// The SRQ an SRQ event names (`None`: not one of ours).
    fn srq_of(&self, ev: &ffi::ibv_async_event) -> Option<SrqId> {
        // SAFETY: the caller passes an SRQ event, whose element union names an SRQ (read, as
        // a pointer value only).
        let raw = unsafe { ev.element.srq };
        self.srqs
            .iter()
            .find(|(_, s)| s.raw == raw)
            .map(|(id, _)| SrqId(*id))
    }
}
