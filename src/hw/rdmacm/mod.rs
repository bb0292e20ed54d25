//! The kernel's connection manager (`ib_cm`, through librdmacm's `rdma_ucm`) for QPs that stay
//! ours: a safe, non-blocking wrapper over `rdma_cma.h`.
//!
//! [`RdmaCm`] owns one event channel and every `rdma_cm_id` created on it. The channel's fd is
//! non-blocking and named by [`RdmaCm::io_source`] for the caller's poller, as
//! [`Provider::io_source`] names a provider's (this module knows no event loop);
//! [`RdmaCm::poll_event`] reads one event, copies out what it carries, acks it and returns it
//! as an [`RdmaCmEvent`], or `None` once the channel would block.
//!
//! No id has a QP of librdmacm's: the QP is created on our own provider and named by number.
//!
//! - **Active**: [`RdmaCm::create_id`], [`RdmaCm::resolve_addr`] (event `AddrResolved`),
//!   [`RdmaCm::resolve_route`] (`RouteResolved`), [`RdmaCm::connect`] with our QPN and private
//!   data; on `ConnectResponse` the caller moves its QP with [`RdmaCm::init_qp_attr`] to RTR
//!   and RTS, then [`RdmaCm::establish`] sends the RTU.
//! - **Passive**: [`RdmaCm::bind_addr`], [`RdmaCm::listen`]; a `ConnectRequest` names a new id
//!   (owned here from then on), the peer's QPN and private data; the caller moves its QP with
//!   [`RdmaCm::init_qp_attr`] to RTR and RTS (the kernel's CM holds the peer's PSN and picks
//!   ours), then [`RdmaCm::accept`]s; `Established` follows the RTU.
//! - **End**: `Rejected`, `Disconnected`, `TimewaitExit`, `DeviceRemoval`. Moving the QP to
//!   ERR is the caller's (the kernel's CM never touches a QP it does not own).
//!
//! Every id is destroyed exactly once: by [`RdmaCm::destroy`], or when the [`RdmaCm`] drops.
//! The table of ids is capped ([`RdmaCm::open`]'s `max_ids`): a connection request beyond it is
//! rejected and destroyed at once and counted in [`RdmaCmStats::requests_refused`].
//!
//! [`Provider::io_source`]: crate::verbs::Provider::io_source

mod af_ib;
mod error;
mod event;
mod ffi;
mod qp_attr;

use std::collections::HashMap;
use std::ffi::c_void;
use std::io;
use std::net::SocketAddr;
use std::ptr;
use std::time::Duration;

use crate::verbs::{IoSource, QpNum, QpState};

pub use af_ib::IbAddr;
pub use error::RdmaCmError;
pub use event::{ConnectRequest, RdmaCmEvent, RdmaCmEventKind, RdmaCmId};
pub use qp_attr::CmQpAttr;

/// A port space of rdma_cm: the service ID is `prefix | port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`, service ID `0x0000000001060000 | port` (rdma-core's examples).
    Tcp,
    /// `RDMA_PS_IB`, service ID `0x00000000013F0000 | port`.
    Ib,
}

impl PortSpace {
    fn to_c(self) -> ffi::rdma_port_space {
        match self {
            Self::Tcp => ffi::RDMA_PS_TCP,
            Self::Ib => ffi::RDMA_PS_IB,
        }
    }

    /// The IB service ID of `port` in this space.
    pub fn service_id(self, port: u16) -> u64 {
        let prefix = match self {
            Self::Tcp => ffi::RDMA_IB_IP_PS_TCP,
            Self::Ib => ffi::RDMA_IB_PS_IB,
        };
        u64::from(prefix) | u64::from(port)
    }
}

/// What a connect or accept asks of the kernel's CM (`rdma_conn_param`).
#[derive(Debug, Clone, Copy)]
pub struct ConnParam<'a> {
    /// Our QP (`qp_num`: the id has no QP of its own).
    pub qp_num: QpNum,
    /// Whether the QP receives from an SRQ.
    pub srq: bool,
    /// Private data: after the cma header in a REQ (at most 56 bytes there), at the start of a
    /// REP (at most 196).
    pub private_data: &'a [u8],
    /// Incoming RDMA READ/atomic depth we grant.
    pub responder_resources: u8,
    /// Outgoing RDMA READ/atomic depth we use.
    pub initiator_depth: u8,
    /// Transport retries asked of the peer (ignored when accepting).
    pub retry_count: u8,
    /// RNR retries asked of the peer (7: for ever).
    pub rnr_retry_count: u8,
}

/// What the wrapper counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RdmaCmStats {
    /// Events read and acked.
    pub events: u64,
    /// Ids created (ours and those of connection requests).
    pub ids_created: u64,
    /// Ids destroyed.
    pub ids_destroyed: u64,
    /// Connection requests rejected because the id table was full.
    pub requests_refused: u64,
}

fn call_err(call: &'static str) -> RdmaCmError {
    RdmaCmError::Call {
        call,
        source: io::Error::last_os_error(),
    }
}

/// librdmacm returns 0, or -1 with `errno` set.
fn check(call: &'static str, rc: i32) -> Result<(), RdmaCmError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(call_err(call))
    }
}

/// The event channel and its ids. See the [module documentation](self).
#[derive(Debug)]
pub struct RdmaCm {
    channel: *mut ffi::rdma_event_channel,
    /// Handle → id; `id->context` holds the handle.
    ids: HashMap<RdmaCmId, *mut ffi::rdma_cm_id>,
    max_ids: usize,
    next: u64,
    stats: RdmaCmStats,
}

impl RdmaCm {
    /// Creates the event channel (non-blocking), for at most `max_ids` ids at a time.
    ///
    /// # Errors
    /// [`RdmaCmError::Unavailable`] where the host has no RDMA CM.
    pub fn open(max_ids: usize) -> Result<Self, RdmaCmError> {
        // SAFETY: no arguments; returns a channel or null with errno set.
        let channel = unsafe { ffi::rdma_create_event_channel() };
        if channel.is_null() {
            return Err(RdmaCmError::Unavailable(io::Error::last_os_error()));
        }
        let cm = Self {
            channel,
            ids: HashMap::new(),
            max_ids,
            next: 1,
            stats: RdmaCmStats::default(),
        };
        super::device::set_nonblocking(cm.fd()).map_err(RdmaCmError::NonBlocking)?;
        Ok(cm)
    }

    fn fd(&self) -> i32 {
        // SAFETY: the channel is live while `self` is.
        unsafe { (*self.channel).fd }
    }

    /// The event channel's fd, read only, for the caller's poller.
    pub fn io_source(&self) -> IoSource {
        IoSource {
            fd: self.fd(),
            writable: false,
        }
    }

    /// What was counted.
    pub fn stats(&self) -> RdmaCmStats {
        self.stats
    }

    /// Live ids.
    pub fn id_count(&self) -> usize {
        self.ids.len()
    }

    fn raw(&self, id: RdmaCmId) -> Result<*mut ffi::rdma_cm_id, RdmaCmError> {
        self.ids.get(&id).copied().ok_or(RdmaCmError::NoSuchId(id))
    }

    /// Takes a raw id into the table under a new handle.
    fn adopt(&mut self, raw: *mut ffi::rdma_cm_id) -> RdmaCmId {
        let id = RdmaCmId(self.next);
        self.next += 1;
        // SAFETY: a live id of this channel; `context` is ours to set.
        unsafe { (*raw).context = id.0 as usize as *mut c_void };
        self.ids.insert(id, raw);
        self.stats.ids_created += 1;
        id
    }

    /// Creates an RC id in `ps`.
    ///
    /// # Errors
    /// [`RdmaCmError::TableFull`], or `rdma_create_id`'s errno.
    pub fn create_id(&mut self, ps: PortSpace) -> Result<RdmaCmId, RdmaCmError> {
        if self.ids.len() >= self.max_ids {
            return Err(RdmaCmError::TableFull(self.max_ids));
        }
        let mut raw = ptr::null_mut();
        // SAFETY: a live channel and a valid out pointer; the context is set by `adopt`.
        let rc = unsafe { ffi::rdma_create_id(self.channel, &mut raw, ptr::null_mut(), ps.to_c()) };
        check("rdma_create_id", rc)?;
        Ok(self.adopt(raw))
    }

    /// Destroys `id` (a connected one sends a DREQ or REJ as the kernel's CM sees fit).
    ///
    /// # Errors
    /// [`RdmaCmError::NoSuchId`].
    pub fn destroy(&mut self, id: RdmaCmId) -> Result<(), RdmaCmError> {
        let raw = self.ids.remove(&id).ok_or(RdmaCmError::NoSuchId(id))?;
        destroy_raw(raw);
        self.stats.ids_destroyed += 1;
        Ok(())
    }

    /// Resolves `dst` (and binds the id to the device that reaches it), from `src` when given;
    /// `AddrResolved` or `AddrError` follows.
    ///
    /// # Errors
    /// The call's errno.
    pub fn resolve_addr(
        &mut self,
        id: RdmaCmId,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        let src = src.map(socket2::SockAddr::from);
        let dst = socket2::SockAddr::from(dst);
        let src_ptr = src
            .as_ref()
            .map_or(ptr::null_mut(), |s| s.as_ptr() as *mut ffi::sockaddr);
        // SAFETY: a live id; the addresses are valid sockaddrs of their family that outlive
        // the call (librdmacm copies them).
        let rc = unsafe {
            ffi::rdma_resolve_addr(
                raw,
                src_ptr,
                dst.as_ptr() as *mut ffi::sockaddr,
                millis(timeout),
            )
        };
        check("rdma_resolve_addr", rc)
    }

    /// [`RdmaCm::resolve_addr`] with an `AF_IB` destination (and no source): the device whose
    /// GID table holds `dst.gid`, then `AddrResolved` or `AddrError`.
    ///
    /// # Errors
    /// The call's errno.
    pub fn resolve_addr_ib(
        &mut self,
        id: RdmaCmId,
        dst: IbAddr,
        timeout: Duration,
    ) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        let mut dst = dst.to_c();
        // SAFETY: a live id; `dst` is a valid sockaddr_ib that outlives the call (copied).
        let rc = unsafe {
            ffi::rdma_resolve_addr(
                raw,
                ptr::null_mut(),
                ptr::from_mut(&mut dst).cast::<ffi::sockaddr>(),
                millis(timeout),
            )
        };
        check("rdma_resolve_addr (AF_IB)", rc)
    }

    /// [`RdmaCm::bind_addr`] to an `AF_IB` address.
    ///
    /// # Errors
    /// The call's errno.
    pub fn bind_addr_ib(&mut self, id: RdmaCmId, addr: IbAddr) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        let mut a = addr.to_c();
        // SAFETY: a live id and a valid sockaddr_ib (copied by the call).
        let rc = unsafe { ffi::rdma_bind_addr(raw, ptr::from_mut(&mut a).cast::<ffi::sockaddr>()) };
        check("rdma_bind_addr (AF_IB)", rc)
    }

    /// Resolves the route of a resolved id; `RouteResolved` or `RouteError` follows.
    ///
    /// # Errors
    /// The call's errno.
    pub fn resolve_route(&mut self, id: RdmaCmId, timeout: Duration) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        // SAFETY: a live id.
        let rc = unsafe { ffi::rdma_resolve_route(raw, millis(timeout)) };
        check("rdma_resolve_route", rc)
    }

    /// Binds `id` to a local address (port 0: any).
    ///
    /// # Errors
    /// The call's errno.
    pub fn bind_addr(&mut self, id: RdmaCmId, addr: SocketAddr) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        let a = socket2::SockAddr::from(addr);
        // SAFETY: a live id and a valid sockaddr (copied by the call).
        let rc = unsafe { ffi::rdma_bind_addr(raw, a.as_ptr() as *mut ffi::sockaddr) };
        check("rdma_bind_addr", rc)
    }

    /// Listens on a bound id; each REQ becomes a `ConnectRequest` with a new id.
    ///
    /// # Errors
    /// The call's errno.
    pub fn listen(&mut self, id: RdmaCmId, backlog: i32) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        // SAFETY: a live id.
        let rc = unsafe { ffi::rdma_listen(raw, backlog) };
        check("rdma_listen", rc)
    }

    /// Sends the REQ for our QP; `ConnectResponse`, `Rejected` or `Unreachable` follows.
    ///
    /// # Errors
    /// Private data too long, or the call's errno.
    pub fn connect(&mut self, id: RdmaCmId, p: &ConnParam<'_>) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        let mut c = conn_param(p)?;
        // SAFETY: a live id; `c` and the private data it points at outlive the call (copied).
        let rc = unsafe { ffi::rdma_connect(raw, &mut c) };
        check("rdma_connect", rc)
    }

    /// Sends the REP of a connection request for our QP (already in RTR or RTS).
    ///
    /// # Errors
    /// Private data too long, or the call's errno.
    pub fn accept(&mut self, id: RdmaCmId, p: &ConnParam<'_>) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        let mut c = conn_param(p)?;
        // SAFETY: as in `connect`.
        let rc = unsafe { ffi::rdma_accept(raw, &mut c) };
        check("rdma_accept", rc)
    }

    /// Rejects a connection request (REJ Consumer Defined with `private_data`).
    ///
    /// # Errors
    /// Private data too long, or the call's errno.
    pub fn reject(&mut self, id: RdmaCmId, private_data: &[u8]) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        let len = u8::try_from(private_data.len())
            .map_err(|_| RdmaCmError::PrivateDataTooLong(private_data.len()))?;
        let data = if private_data.is_empty() {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: a live id; the data is `len` readable bytes (copied by the call).
        let rc = unsafe { ffi::rdma_reject(raw, data, len) };
        check("rdma_reject", rc)
    }

    /// Sends the RTU after our QP moved to RTS on a `ConnectResponse`.
    ///
    /// # Errors
    /// The call's errno.
    pub fn establish(&mut self, id: RdmaCmId) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        // SAFETY: a live id.
        let rc = unsafe { ffi::rdma_establish(raw) };
        check("rdma_establish", rc)
    }

    /// Sends a DREQ, or the DREP of a DREQ received; `Disconnected` follows (or came).
    ///
    /// # Errors
    /// The call's errno.
    pub fn disconnect(&mut self, id: RdmaCmId) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        // SAFETY: a live id.
        let rc = unsafe { ffi::rdma_disconnect(raw) };
        check("rdma_disconnect", rc)
    }

    /// Tells the kernel's CM that our passive QP received before the RTU (`IB_EVENT_COMM_EST`
    /// on it): the connection is established (`Established` follows).
    ///
    /// # Errors
    /// The call's errno.
    pub fn notify_comm_est(&mut self, id: RdmaCmId) -> Result<(), RdmaCmError> {
        let raw = self.raw(id)?;
        // SAFETY: a live id.
        let rc = unsafe { ffi::rdma_notify(raw, ffi::IBV_EVENT_COMM_EST) };
        check("rdma_notify", rc)
    }

    /// The attributes that move our QP to `state` (RTR or RTS; INIT too) for this connection.
    ///
    /// # Errors
    /// The call's errno (the connection is in no state for that move), or attributes
    /// [`CmQpAttr`] cannot carry.
    pub fn init_qp_attr(&mut self, id: RdmaCmId, state: QpState) -> Result<CmQpAttr, RdmaCmError> {
        let raw = self.raw(id)?;
        let mut a = ffi::ibv_qp_attr {
            qp_state: qp_attr::state_to(state),
            ..Default::default()
        };
        let mut mask = 0i32;
        // SAFETY: a live id and valid out pointers.
        let rc = unsafe { ffi::rdma_init_qp_attr(raw, &mut a, &mut mask) };
        check("rdma_init_qp_attr", rc)?;
        qp_attr::from_c(&a, mask)
    }

    /// Reads, copies out and acks one event; `None` once the channel would block.
    ///
    /// # Errors
    /// `rdma_get_cm_event`'s errno other than `EAGAIN`.
    pub fn poll_event(&mut self) -> Result<Option<RdmaCmEvent>, RdmaCmError> {
        // Requests refused for a full table are consumed here; the loop ends at the first
        // event to hand out or when the channel would block, and is bounded besides.
        for _ in 0..MAX_REFUSED_PER_POLL {
            match self.read_one()? {
                Read::Event(e) => return Ok(Some(e)),
                Read::Empty => return Ok(None),
                Read::Refused => {}
            }
        }
        Ok(None)
    }

    fn read_one(&mut self) -> Result<Read, RdmaCmError> {
        let mut ev = ptr::null_mut();
        // SAFETY: a live channel and a valid out pointer.
        let rc = unsafe { ffi::rdma_get_cm_event(self.channel, &mut ev) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Read::Empty),
                _ => Err(RdmaCmError::Call {
                    call: "rdma_get_cm_event",
                    source: e,
                }),
            };
        }
        self.stats.events += 1;
        // SAFETY: `ev` is a live event until acked below; `copy` reads only within it.
        let (raw_id, kind) = unsafe { event::copy(&*ev) };
        // SAFETY: `ev` came from rdma_get_cm_event and is acked once; nothing of it is used
        // after.
        unsafe { ffi::rdma_ack_cm_event(ev) };
        let id = if matches!(kind, RdmaCmEventKind::ConnectRequest(_)) {
            // The new id is ours from now on: take it into the table, or refuse it.
            if self.ids.len() >= self.max_ids {
                self.stats.requests_refused += 1;
                // SAFETY: the request's live id (not in the table); its only event is acked.
                unsafe { ffi::rdma_reject(raw_id, ptr::null(), 0) };
                destroy_raw(raw_id);
                return Ok(Read::Refused);
            }
            self.adopt(raw_id)
        } else {
            event::handle_of(raw_id)
        };
        Ok(Read::Event(RdmaCmEvent { id, kind }))
    }
}

/// Connection requests refused for a full table that one [`RdmaCm::poll_event`] consumes.
const MAX_REFUSED_PER_POLL: usize = 64;

/// One read of the channel.
enum Read {
    Event(RdmaCmEvent),
    Empty,
    Refused,
}

impl Drop for RdmaCm {
    fn drop(&mut self) {
        // Requests' ids first, listeners after (either order works; this one is tidy).
        let mut ids: Vec<_> = self.ids.drain().collect();
        ids.sort_by_key(|(id, _)| std::cmp::Reverse(*id));
        for (_, raw) in ids {
            destroy_raw(raw);
            self.stats.ids_destroyed += 1;
        }
        // SAFETY: every id of the channel is destroyed; the channel is destroyed once.
        unsafe { ffi::rdma_destroy_event_channel(self.channel) };
    }
}

/// Destroys a live id whose events are all acked (every event is acked as it is read).
fn destroy_raw(raw: *mut ffi::rdma_cm_id) {
    // SAFETY: a live id, destroyed once (the caller removed it from the table); its events
    // are acked, so the call does not wait on them.
    unsafe { ffi::rdma_destroy_id(raw) };
}

fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

fn conn_param(p: &ConnParam<'_>) -> Result<ffi::rdma_conn_param, RdmaCmError> {
    let len = u8::try_from(p.private_data.len())
        .map_err(|_| RdmaCmError::PrivateDataTooLong(p.private_data.len()))?;
    Ok(ffi::rdma_conn_param {
        private_data: if p.private_data.is_empty() {
            ptr::null()
        } else {
            p.private_data.as_ptr().cast()
        },
        private_data_len: len,
        responder_resources: p.responder_resources,
        initiator_depth: p.initiator_depth,
        flow_control: 1,
        retry_count: p.retry_count,
        rnr_retry_count: p.rnr_retry_count,
        srq: u8::from(p.srq),
        qp_num: p.qp_num.get(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_are_rdma_cm_port_spaces() {
        assert_eq!(PortSpace::Tcp.service_id(7471), 0x0106_1d2f);
        assert_eq!(PortSpace::Ib.service_id(0x1234), 0x013f_1234);
    }

    /// Without rdma_ucm (CI), opening fails cleanly with an "unavailable" error.
    #[test]
    fn open_without_rdma_cm_is_a_clean_error() {
        if std::path::Path::new("/dev/infiniband/rdma_cm").exists() {
            return;
        }
        let e = RdmaCm::open(4).unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        assert!(e.to_string().starts_with("no RDMA CM"), "{e}");
    }

    #[test]
    fn private_data_longer_than_a_message_is_refused() {
        let big = [0u8; 256];
        let p = ConnParam {
            qp_num: QpNum::new(0x11),
            srq: false,
            private_data: &big,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        assert!(matches!(
            conn_param(&p),
            Err(RdmaCmError::PrivateDataTooLong(256))
        ));
        let c = conn_param(&ConnParam {
            private_data: &big[..56],
            ..p
        })
        .unwrap();
        assert_eq!((c.private_data_len, c.qp_num, c.srq), (56, 0x11, 0));
    }
}
