//! The events of the channel, copied out of librdmacm's `rdma_cm_event` before the ack frees
//! it: a small enum of what the caller acts on.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::ffi;
use crate::verbs::QpNum;

/// One `rdma_cm_id` of an `RdmaCm`: a handle, valid until `RdmaCm::destroy`; the
/// handle's value is what the id's `context` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RdmaCmId(pub(super) u64);

/// One event of an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaCmEvent {
    /// The id it concerns (for a connection request, the new id).
    pub id: RdmaCmId,
    /// What happened.
    pub kind: RdmaCmEventKind,
}

/// A REQ the kernel's CM accepted for one of our listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The listening id the REQ reached.
    pub listener: RdmaCmId,
    /// The peer's QP.
    pub remote_qpn: QpNum,
    /// The REQ's private data after the cma header (padded: 56 bytes in a REQ).
    pub private_data: Vec<u8>,
    /// The peer's responder resources.
    pub responder_resources: u8,
    /// The peer's initiator depth.
    pub initiator_depth: u8,
    /// The peer's RNR retry count.
    pub rnr_retry_count: u8,
    /// The peer's address as the cma header gave it.
    pub peer: Option<SocketAddr>,
    /// The address the REQ was sent to.
    pub local: Option<SocketAddr>,
}

/// What happened to an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdmaCmEventKind {
    /// `rdma_resolve_addr` finished: the id is bound to a device.
    AddrResolved,
    /// `rdma_resolve_route` finished.
    RouteResolved,
    /// A REQ arrived on a listener; [`RdmaCmEvent::id`] is the new connection's id.
    ConnectRequest(ConnectRequest),
    /// Our REQ drew a REP: move the QP to RTR and RTS, then establish.
    ConnectResponse {
        /// The peer's QP.
        remote_qpn: QpNum,
        /// The REP's private data.
        private_data: Vec<u8>,
    },
    /// The connection is established (the RTU arrived, on the passive side).
    Established,
    /// Our REQ (or REP) was rejected.
    Rejected {
        /// The REJ's reason code (or a negative errno where no REJ came).
        reason: i32,
        /// The REJ's private data (the kernel's consumer-defined rejects carry none).
        private_data: Vec<u8>,
    },
    /// The peer disconnected, or our DREQ was answered or timed out.
    Disconnected,
    /// The connection left TimeWait.
    TimewaitExit,
    /// The device went away: destroy the id.
    DeviceRemoval,
    /// Address or route resolution, connection set-up, or the peer's reachability failed.
    Failed {
        /// Which: `ADDR_ERROR`, `ROUTE_ERROR`, `CONNECT_ERROR` or `UNREACHABLE`.
        what: &'static str,
        /// The event's status (a negative errno, or the CM's code).
        status: i32,
    },
    /// An event this wrapper does not act on (multicast, address change), by number.
    Other(u32),
}

/// The handle stored in a live id's `context`.
pub(super) fn handle_of(raw: *mut ffi::rdma_cm_id) -> RdmaCmId {
    // SAFETY: a live id of the channel; the wrapper set its context (or, for a request's new
    // id before adoption, inherited the listener's).
    let ctx = unsafe { (*raw).context };
    RdmaCmId(ctx as usize as u64)
}

/// The `len` bytes at `p` (none when null).
///
/// # Safety
/// `p` is null or points at `len` readable bytes.
unsafe fn bytes(p: *const std::ffi::c_void, len: u8) -> Vec<u8> {
    if p.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), usize::from(len)) }.to_vec()
}

/// A socket address of family AF_INET or AF_INET6 at `sa`.
///
/// # Safety
/// `sa` points at a `sockaddr_storage`-sized address.
unsafe fn socket_addr(sa: *const ffi::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: the caller's contract; the family field is at the start of every sockaddr.
    let family = i32::from(unsafe { (*sa.cast::<libc::sockaddr>()).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in, within the storage.
            let s = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr));
            Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(s.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6, within the storage.
            let s = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
            Some(SocketAddr::new(IpAddr::V6(ip), u16::from_be(s.sin6_port)))
        }
        _ => None,
    }
}

/// Copies what `ev` carries, before its ack.
///
/// # Safety
/// `ev` is a live event of the channel, not yet acked.
pub(super) unsafe fn copy(ev: &ffi::rdma_cm_event) -> (*mut ffi::rdma_cm_id, RdmaCmEventKind) {
    let conn = || {
        // SAFETY: the connection events of RC ids (the only ids this wrapper creates) carry
        // `rdma_conn_param`, the member of the union read; a plain C struct of any bits.
        unsafe { ev.param.conn }
    };
    let data = |c: &ffi::rdma_conn_param| {
        // SAFETY: the event's private data, `private_data_len` bytes, live until the ack.
        unsafe { bytes(c.private_data, c.private_data_len) }
    };
    let failed = |what| RdmaCmEventKind::Failed {
        what,
        status: ev.status,
    };
    let kind = match ev.event {
        ffi::RDMA_CM_EVENT_ADDR_RESOLVED => RdmaCmEventKind::AddrResolved,
        ffi::RDMA_CM_EVENT_ROUTE_RESOLVED => RdmaCmEventKind::RouteResolved,
        ffi::RDMA_CM_EVENT_CONNECT_REQUEST => {
            let c = conn();
            // SAFETY: a request's new id is live; its route's addresses are sockaddr unions
            // of storage size.
            let (peer, local) = unsafe {
                let addr = &(*ev.id).route.addr;
                (
                    socket_addr(&addr.__bindgen_anon_2.dst_storage),
                    socket_addr(&addr.__bindgen_anon_1.src_storage),
                )
            };
            RdmaCmEventKind::ConnectRequest(ConnectRequest {
                listener: handle_of(ev.listen_id),
                remote_qpn: QpNum::new(c.qp_num),
                private_data: data(&c),
                responder_resources: c.responder_resources,
                initiator_depth: c.initiator_depth,
                rnr_retry_count: c.rnr_retry_count,
                peer,
                local,
            })
        }
        ffi::RDMA_CM_EVENT_CONNECT_RESPONSE => {
            let c = conn();
            RdmaCmEventKind::ConnectResponse {
                remote_qpn: QpNum::new(c.qp_num),
                private_data: data(&c),
            }
        }
        ffi::RDMA_CM_EVENT_ESTABLISHED => RdmaCmEventKind::Established,
        ffi::RDMA_CM_EVENT_REJECTED => {
            let c = conn();
            RdmaCmEventKind::Rejected {
                reason: ev.status,
                private_data: data(&c),
            }
        }
        ffi::RDMA_CM_EVENT_DISCONNECTED => RdmaCmEventKind::Disconnected,
        ffi::RDMA_CM_EVENT_TIMEWAIT_EXIT => RdmaCmEventKind::TimewaitExit,
        ffi::RDMA_CM_EVENT_DEVICE_REMOVAL => RdmaCmEventKind::DeviceRemoval,
        ffi::RDMA_CM_EVENT_ADDR_ERROR => failed("ADDR_ERROR"),
        ffi::RDMA_CM_EVENT_ROUTE_ERROR => failed("ROUTE_ERROR"),
        ffi::RDMA_CM_EVENT_CONNECT_ERROR => failed("CONNECT_ERROR"),
        ffi::RDMA_CM_EVENT_UNREACHABLE => failed("UNREACHABLE"),
        other => RdmaCmEventKind::Other(other),
    };
    (ev.id, kind)
}
