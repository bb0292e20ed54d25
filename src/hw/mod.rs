//! The libibverbs hardware provider ([`HwVerbs`]), behind the `verbs` cargo feature.
//!
//! [`HwVerbs`] implements [`Verbs`] and [`Provider`] over raw `ibverbs-sys` (the safe `ibverbs`
//! crate cannot register existing memory, create SRQs or completion channels, or modify QPs).
//! One instance is one device context on one port and one GID index.
//!
//! What the hardware does not track, this wrapper does, so that the contract of
//! [`crate::verbs`] holds on every device:
//!
//! - **Buffers**: each pool is one MR (`ibv_reg_mr` over the pool's memory). Every posted WR
//!   gets a provider-internal `wr_id`; a table maps it back to the caller's [`WrId`] and
//!   [`BufId`], so completions carry `buf`, a destroyed QP or SRQ frees its posted buffers, and
//!   an unsignaled send is posted signaled on the device and its successful completion is
//!   swallowed (its buffer freed), as the contract asks.
//! - **State rules**: [`check_modify`] runs first (against the state `ibv_query_qp` reports), so
//!   a bad modify fails exactly as on the software provider; `post_send` before RTS and
//!   `post_recv` in RESET fail with [`VerbsError::InvalidState`]; queue depths are enforced as
//!   requested (the device may round them up).
//! - **Object rules**: CQs, SRQs and PDs count their users and refuse destruction with
//!   [`VerbsError::Busy`].
//! - **I/O**: all CQs share one completion channel; its fd and the async-event fd are
//!   non-blocking and registered with mio. On readiness [`Provider::handle_io`] reads every CQ
//!   event, acks it and re-arms the CQ (the caller then polls); async events are translated to
//!   [`AsyncEvent`] and acked one by one.
//!
//! The hardware provider cannot own QP1 (the kernel does), so [`QpType::Gsi`] QPs are refused;
//! CM MADs need a side channel there.
//!
//! Every `unsafe` block of the crate's provider code lives in this module.
#![allow(unsafe_code)]

pub mod conformance;

use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::ptr;
use std::time::Instant;

use ibverbs_sys as ffi;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use crate::verbs::{
    check_modify, AddressVector, AsyncEvent, BufId, BufPools, Completion, CqId, Gid, PathMtu, PdId,
    PoolId, PortAttr, Provider, QpAttr, QpInit, QpNum, QpState, QpType, SendWr, SrqId, SrqInit,
    Verbs, VerbsError, WcOpcode, WcStatus, WrId,
};

/// Why a device could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum HwError {
    /// There is no usable RDMA device (no RDMA stack, no device, or not the named one).
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// A verb failed while opening the device.
    #[error("{0}")]
    Verbs(String),
}

/// What to open.
#[derive(Debug, Clone, Default)]
pub struct HwConfig {
    /// Device name (`rxe0`, `mlx5_0`); the first device when `None`.
    pub device: Option<String>,
    /// Port number; 1 when `None`.
    pub port: Option<u8>,
    /// GID index; when `None`, the RoCEv2 IPv4-mapped GID of `local_ip`, else 0.
    pub gid_index: Option<u8>,
    /// The local IP address whose GID to use.
    pub local_ip: Option<IpAddr>,
}

#[derive(Debug)]
struct Pd {
    raw: *mut ffi::ibv_pd,
    users: usize,
}

#[derive(Debug)]
struct Cq {
    raw: *mut ffi::ibv_cq,
    users: usize,
}

#[derive(Debug)]
struct Srq {
    raw: *mut ffi::ibv_srq,
    pd: PdId,
    max_wr: u32,
    users: usize,
    posted: usize,
}

#[derive(Debug)]
struct Qp {
    raw: *mut ffi::ibv_qp,
    qp_type: QpType,
    state: QpState,
    pd: PdId,
    send_cq: CqId,
    recv_cq: CqId,
    srq: Option<SrqId>,
    max_send_wr: u32,
    max_recv_wr: u32,
    sq_sig_all: bool,
    /// Internal ids of outstanding send WRs, oldest first.
    sends: VecDeque<u64>,
    recvs: usize,
    mcast: Vec<Gid>,
}

/// Who an outstanding WR belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Qp(QpNum),
    Srq(SrqId),
}

#[derive(Debug, Clone, Copy)]
struct Wr {
    owner: Owner,
    user: WrId,
    buf: Option<BufId>,
    send: bool,
    signaled: bool,
}

/// A libibverbs device context on one port. See the [module documentation](self).
#[derive(Debug)]
pub struct HwVerbs {
    ctx: *mut ffi::ibv_context,
    channel: *mut ffi::ibv_comp_channel,
    port: u8,
    gid_index: u8,
    attr: PortAttr,
    name: String,
    pools: BufPools,
    /// Pool → (MR, its PD).
    mrs: HashMap<PoolId, (*mut ffi::ibv_mr, PdId)>,
    pds: HashMap<u32, Pd>,
    cqs: HashMap<u32, Cq>,
    srqs: HashMap<u32, Srq>,
    qps: HashMap<u32, Qp>,
    ahs: HashMap<(PdId, AddressVector), *mut ffi::ibv_ah>,
    wrs: HashMap<u64, Wr>,
    next_wr: u64,
    next_id: u32,
    events: VecDeque<AsyncEvent>,
    wc: Vec<ffi::ibv_wc>,
    stats: HwStats,
}

/// What the libibverbs provider counted, for the daemon's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HwStats {
    /// Work completions handed out.
    pub completions: u64,
    /// Of those, completions with an error status (flushes included).
    pub completion_errors: u64,
    /// Asynchronous events read from the device.
    pub async_events: u64,
    /// Of those, events of a kind the provider does not pass on.
    pub async_unhandled: u64,
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

fn errno_err(what: &str, rc: i32) -> VerbsError {
    // Verbs return a positive errno (or -1 with errno set).
    let e = if rc > 0 {
        io::Error::from_raw_os_error(rc)
    } else {
        io::Error::last_os_error()
    };
    match e.raw_os_error() {
        Some(libc::ENOMEM) => VerbsError::OutOfResources("device memory"),
        _ => VerbsError::Io(format!("{what}: {e}")),
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd we own; F_GETFL/F_SETFL take no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn mtu_from(m: ffi::ibv_mtu) -> PathMtu {
    PathMtu::from_enum(u8::try_from(m).unwrap_or(1)).unwrap_or(PathMtu::Mtu256)
}

fn state_to(s: QpState) -> ffi::ibv_qp_state::Type {
    use ffi::ibv_qp_state as S;
    match s {
        QpState::Reset => S::IBV_QPS_RESET,
        QpState::Init => S::IBV_QPS_INIT,
        QpState::Rtr => S::IBV_QPS_RTR,
        QpState::Rts => S::IBV_QPS_RTS,
        QpState::Sqd => S::IBV_QPS_SQD,
        QpState::Sqe => S::IBV_QPS_SQE,
        QpState::Err => S::IBV_QPS_ERR,
    }
}

fn state_from(s: ffi::ibv_qp_state::Type) -> QpState {
    use ffi::ibv_qp_state as S;
    match s {
        S::IBV_QPS_RESET => QpState::Reset,
        S::IBV_QPS_INIT => QpState::Init,
        S::IBV_QPS_RTR => QpState::Rtr,
        S::IBV_QPS_RTS => QpState::Rts,
        S::IBV_QPS_SQD => QpState::Sqd,
        S::IBV_QPS_SQE => QpState::Sqe,
        _ => QpState::Err,
    }
}

fn status_from(s: ffi::ibv_wc_status::Type) -> WcStatus {
    use ffi::ibv_wc_status as S;
    match s {
        S::IBV_WC_SUCCESS => WcStatus::Success,
        S::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        S::IBV_WC_LOC_QP_OP_ERR => WcStatus::LocQpOpErr,
        S::IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        S::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        S::IBV_WC_BAD_RESP_ERR => WcStatus::BadRespErr,
        S::IBV_WC_LOC_ACCESS_ERR => WcStatus::LocAccessErr,
        S::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        S::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        S::IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        S::IBV_WC_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        S::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RnrRetryExcErr,
        _ => WcStatus::GeneralErr,
    }
}

/// The attribute mask bit of `ibv_qp_attr_mask`.
fn bit(m: ffi::ibv_qp_attr_mask) -> i32 {
    m.0 as i32
}

/// Reads `/sys/class/infiniband/DEV/ports/PORT/gid_attrs/types/IDX` ("RoCE v2", "IB/RoCE v1").
fn gid_type(dev: &str, port: u8, idx: i32) -> Option<String> {
    let p = format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{idx}");
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

impl HwVerbs {
    /// What the provider counted so far.
    pub fn stats(&self) -> HwStats {
        self.stats
    }

    /// QPs that exist now (created and not yet destroyed).
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// Opens the device, queries the port and picks the GID index.
    ///
    /// # Errors
    /// [`HwError::NoDevice`] when there is no RDMA stack or no (such) device; [`HwError::Verbs`]
    /// when opening it fails.
    pub fn open(cfg: &HwConfig) -> Result<Self, HwError> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out pointer; the list is freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = io::Error::last_os_error();
            return Err(HwError::NoDevice(format!("ibv_get_device_list: {e}")));
        }
        let mut found: *mut ffi::ibv_device = ptr::null_mut();
        let mut names = Vec::new();
        for i in 0..usize::try_from(n).unwrap_or(0) {
            // SAFETY: the list holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: a valid device has a NUL-terminated name.
            let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            let want = cfg.device.as_deref().is_none_or(|d| d == name);
            if want && found.is_null() {
                found = dev;
            }
            names.push(name);
        }
        let ctx = if found.is_null() {
            ptr::null_mut()
        } else {
            // SAFETY: `found` is a device of the live list.
            unsafe { ffi::ibv_open_device(found) }
        };
        let open_err = os_err("ibv_open_device");
        // SAFETY: the list came from ibv_get_device_list; opened contexts stay valid.
        unsafe { ffi::ibv_free_device_list(list) };
        if found.is_null() {
            return Err(HwError::NoDevice(match &cfg.device {
                Some(d) => format!("{d} not found (devices: {})", names.join(" ")),
                None => "ibv_get_device_list found none".into(),
            }));
        }
        if ctx.is_null() {
            return Err(HwError::Verbs(open_err));
        }
        let name = cfg
            .device
            .clone()
            .or_else(|| names.first().cloned())
            .unwrap_or_default();
        // From here on, Drop closes the context.
        let mut v = Self {
            ctx,
            channel: ptr::null_mut(),
            port: cfg.port.unwrap_or(1),
            gid_index: 0,
            attr: PortAttr {
                gid: Gid([0; 16]),
                active_mtu: PathMtu::Mtu1024,
                max_mtu: PathMtu::Mtu1024,
                max_msg_size: 1 << 31,
                active: false,
            },
            name,
            pools: BufPools::new(),
            mrs: HashMap::new(),
            pds: HashMap::new(),
            cqs: HashMap::new(),
            srqs: HashMap::new(),
            qps: HashMap::new(),
            ahs: HashMap::new(),
            wrs: HashMap::new(),
            next_wr: 1,
            next_id: 1,
            events: VecDeque::new(),
            wc: Vec::new(),
            stats: HwStats::default(),
        };
        v.init(cfg)?;
        Ok(v)
    }

    fn init(&mut self, cfg: &HwConfig) -> Result<(), HwError> {
        // SAFETY: ibv_port_attr is a plain C struct; all-zero is valid.
        let mut pa: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the exported ibv_query_port writes a full `ibv_port_attr` through the
        // provider's query_port (the `_compat` type only names the older, smaller prefix).
        let rc = unsafe { ffi::ibv_query_port(self.ctx, self.port, (&raw mut pa).cast()) };
        if rc != 0 {
            return Err(HwError::Verbs(format!(
                "ibv_query_port({} port {}): {}",
                self.name,
                self.port,
                io::Error::from_raw_os_error(rc.abs())
            )));
        }
        let mut chosen = cfg.gid_index;
        let mut gids = Vec::new();
        for i in 0..pa.gid_tbl_len.min(256) {
            let mut g = ffi::ibv_gid { raw: [0; 16] };
            // SAFETY: valid context and out pointer.
            if unsafe { ffi::ibv_query_gid(self.ctx, self.port, i, &mut g) } != 0 {
                continue;
            }
            // SAFETY: every bit pattern of the union is a valid `raw`.
            let raw = unsafe { g.raw };
            if raw != [0; 16] {
                gids.push((i, Gid(raw)));
            }
        }
        if chosen.is_none() {
            if let Some(ip) = cfg.local_ip {
                let want = Gid::from_ip(ip);
                let v2 = gids.iter().find(|(i, g)| {
                    *g == want
                        && gid_type(&self.name, self.port, *i).is_some_and(|t| t == "RoCE v2")
                });
                let any = gids.iter().rfind(|(_, g)| *g == want);
                chosen = v2.or(any).and_then(|(i, _)| u8::try_from(*i).ok());
            }
        }
        self.gid_index = chosen.unwrap_or(0);
        let gid = gids
            .iter()
            .find(|(i, _)| *i == i32::from(self.gid_index))
            .map(|(_, g)| *g)
            .ok_or_else(|| {
                HwError::Verbs(format!(
                    "{} port {}: GID index {} is empty",
                    self.name, self.port, self.gid_index
                ))
            })?;
        self.attr = PortAttr {
            gid,
            active_mtu: mtu_from(pa.active_mtu),
            max_mtu: mtu_from(pa.max_mtu),
            max_msg_size: pa.max_msg_sz as usize,
            active: pa.state == ffi::ibv_port_state::IBV_PORT_ACTIVE,
        };
        // SAFETY: valid context.
        self.channel = unsafe { ffi::ibv_create_comp_channel(self.ctx) };
        if self.channel.is_null() {
            return Err(HwError::Verbs(os_err("ibv_create_comp_channel")));
        }
        // SAFETY: the channel and the context are valid; their fds are theirs.
        let (cfd, afd) = unsafe { ((*self.channel).fd, (*self.ctx).async_fd) };
        set_nonblocking(cfd)
            .and_then(|()| set_nonblocking(afd))
            .map_err(|e| HwError::Verbs(format!("O_NONBLOCK: {e}")))?;
        Ok(())
    }

    /// The device name.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// The GID index in use.
    pub fn gid_index(&self) -> u8 {
        self.gid_index
    }

    fn id(&mut self) -> u32 {
        let i = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        i
    }

    fn pd_raw(&self, pd: PdId) -> Result<*mut ffi::ibv_pd, VerbsError> {
        self.pds
            .get(&pd.0)
            .map(|p| p.raw)
            .ok_or(VerbsError::NoSuchObject("PD"))
    }

    fn cq_raw(&self, cq: CqId) -> Result<*mut ffi::ibv_cq, VerbsError> {
        self.cqs
            .get(&cq.0)
            .map(|c| c.raw)
            .ok_or(VerbsError::NoSuchObject("CQ"))
    }

    fn use_pd(&mut self, pd: PdId, d: isize) {
        if let Some(p) = self.pds.get_mut(&pd.0) {
            p.users = p.users.saturating_add_signed(d);
        }
    }

    fn use_cq(&mut self, cq: CqId, d: isize) {
        if let Some(c) = self.cqs.get_mut(&cq.0) {
            c.users = c.users.saturating_add_signed(d);
        }
    }

    /// One SGE over `buf` (its first `len` bytes) in its pool's MR.
    fn sge(&mut self, buf: BufId, len: usize) -> Result<ffi::ibv_sge, VerbsError> {
        let blen = self.pools.buf_len(buf.pool)?;
        if len > blen {
            return Err(VerbsError::TooLong { len, limit: blen });
        }
        let &(mr, _) = self
            .mrs
            .get(&buf.pool)
            .ok_or(VerbsError::NoSuchObject("pool"))?;
        let (base, total) = self
            .pools
            .region(buf.pool)
            .ok_or(VerbsError::NoSuchObject("pool"))?;
        let off = (buf.index as usize)
            .checked_mul(blen)
            .filter(|o| o + blen <= total)
            .ok_or(VerbsError::BufferNotHeld(buf))?;
        // SAFETY: the MR is live (pools and MRs live as long as `self`).
        let lkey = unsafe { (*mr).lkey };
        Ok(ffi::ibv_sge {
            addr: base as u64 + off as u64,
            length: u32::try_from(len).map_err(|_| VerbsError::TooLong {
                len,
                limit: u32::MAX as usize,
            })?,
            lkey,
        })
    }

    fn new_wr(&mut self, wr: Wr) -> u64 {
        let id = self.next_wr;
        self.next_wr += 1;
        self.wrs.insert(id, wr);
        id
    }

    fn ah_for(&mut self, pd: PdId, av: AddressVector) -> Result<*mut ffi::ibv_ah, VerbsError> {
        if let Some(ah) = self.ahs.get(&(pd, av)) {
            return Ok(*ah);
        }
        let raw_pd = self.pd_raw(pd)?;
        // SAFETY: ibv_ah_attr is a plain C struct; all-zero is valid.
        let mut a: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.is_global = 1;
        a.port_num = self.port;
        a.grh.dgid = ffi::ibv_gid { raw: av.dgid.0 };
        a.grh.sgid_index = self.gid_index;
        a.grh.hop_limit = av.hop_limit;
        a.grh.traffic_class = av.traffic_class;
        a.grh.flow_label = av.flow_label;
        // SAFETY: valid PD and attribute struct.
        let ah = unsafe { ffi::ibv_create_ah(raw_pd, &mut a) };
        if ah.is_null() {
            return Err(errno_err("ibv_create_ah", -1));
        }
        self.ahs.insert((pd, av), ah);
        self.use_pd(pd, 1);
        Ok(ah)
    }

    /// Reads every pending completion-channel event, acks it and re-arms its CQ.
    fn drain_channel(&mut self) {
        if self.channel.is_null() {
            return;
        }
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            // SAFETY: valid channel (non-blocking fd) and out pointers.
            if unsafe { ffi::ibv_get_cq_event(self.channel, &mut cq, &mut cq_ctx) } != 0 {
                break;
            }
            // SAFETY: `cq` was returned by the channel and is still live (we destroy CQs only
            // after draining the channel).
            unsafe {
                ffi::ibv_ack_cq_events(cq, 1);
                if let Some(arm) = (*self.ctx).ops.req_notify_cq {
                    arm(cq, 0);
                }
            }
        }
    }

    /// Reads every pending async event and queues it.
    fn drain_async(&mut self) {
        loop {
            // SAFETY: ibv_async_event is plain C data; all-zero is valid.
            let mut ev: ffi::ibv_async_event = unsafe { std::mem::zeroed() };
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
                    // SAFETY: as above, an SRQ event names an SRQ.
                    let raw = unsafe { ev.element.srq };
                    self.srqs
                        .iter()
                        .find(|(_, s)| s.raw == raw)
                        .map(|(id, _)| AsyncEvent::SrqLimitReached(SrqId(*id)))
                }
                ffi::IBV_EVENT_PORT_ACTIVE => Some(AsyncEvent::PortActive),
                ffi::IBV_EVENT_PORT_ERR => Some(AsyncEvent::PortErr),
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

    /// Frees the buffers of every outstanding WR of `owner`.
    fn release_owner(&mut self, owner: Owner) {
        let ids: Vec<u64> = self
            .wrs
            .iter()
            .filter(|(_, w)| w.owner == owner)
            .map(|(i, _)| *i)
            .collect();
        for i in ids {
            if let Some(w) = self.wrs.remove(&i) {
                if let Some(b) = w.buf {
                    self.pools.release(b);
                }
            }
        }
    }

    fn post_recv_raw(&mut self, owner: Owner, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        let blen = self.pools.buf_len(buf.pool)?;
        let mut sge = self.sge(buf, blen)?;
        self.pools.lend(buf)?;
        let id = self.new_wr(Wr {
            owner,
            user: wr_id,
            buf: Some(buf),
            send: false,
            signaled: true,
        });
        let mut wr = ffi::ibv_recv_wr {
            wr_id: id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP/SRQ pointers are live objects of this context; `wr` and `sge` outlive
        // the call (the device copies them); the SGE lies inside the pool's registered MR.
        let rc = unsafe {
            match owner {
                Owner::Qp(q) => {
                    let raw = self.qps.get(&q.get()).map_or(ptr::null_mut(), |x| x.raw);
                    match (*self.ctx).ops.post_recv {
                        Some(f) if !raw.is_null() => f(raw, &mut wr, &mut bad),
                        _ => libc::EINVAL,
                    }
                }
                Owner::Srq(s) => {
                    let raw = self.srqs.get(&s.0).map_or(ptr::null_mut(), |x| x.raw);
                    match (*self.ctx).ops.post_srq_recv {
                        Some(f) if !raw.is_null() => f(raw, &mut wr, &mut bad),
                        _ => libc::EINVAL,
                    }
                }
            }
        };
        if rc != 0 {
            self.wrs.remove(&id);
            self.pools.reclaim(buf);
            return Err(if rc == libc::ENOMEM {
                VerbsError::QueueFull
            } else {
                errno_err("post_recv", rc)
            });
        }
        Ok(())
    }

    /// Maps one work completion; `None` for a WR this wrapper no longer tracks.
    fn map_wc(&mut self, wc: &ffi::ibv_wc) -> Option<Completion> {
        let id = wc.wr_id();
        let w = self.wrs.remove(&id)?;
        let status = status_from(
            wc.error()
                .map_or(ffi::ibv_wc_status::IBV_WC_SUCCESS, |e| e.0),
        );
        let qp = QpNum::new(wc.qp_num);
        if w.send {
            // Sends complete in order: earlier unsignaled sends of this QP are done too.
            if let Owner::Qp(q) = w.owner {
                let mut done = Vec::new();
                if let Some(x) = self.qps.get_mut(&q.get()) {
                    while let Some(front) = x.sends.pop_front() {
                        if front == id {
                            break;
                        }
                        done.push(front);
                    }
                }
                for d in done {
                    if let Some(e) = self.wrs.remove(&d) {
                        if let Some(b) = e.buf {
                            self.pools.release(b);
                        }
                    }
                }
            }
        } else {
            match w.owner {
                Owner::Qp(q) => {
                    if let Some(x) = self.qps.get_mut(&q.get()) {
                        x.recvs = x.recvs.saturating_sub(1);
                    }
                }
                Owner::Srq(s) => {
                    if let Some(x) = self.srqs.get_mut(&s.0) {
                        x.posted = x.posted.saturating_sub(1);
                    }
                }
            }
        }
        let ok = status == WcStatus::Success;
        if w.send && ok && !w.signaled {
            // An unsignaled send that succeeded: nobody is told, its buffer goes back.
            if let Some(b) = w.buf {
                self.pools.release(b);
            }
            return None;
        }
        if let Some(b) = w.buf {
            self.pools.reclaim(b);
        }
        let recv = !w.send;
        let flags = wc.wc_flags;
        let imm = (ok && recv && (flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM).0 != 0)
            .then(|| u32::from_be(wc.imm_data));
        let grh = ok && recv && (flags & ffi::ibv_wc_flags::IBV_WC_GRH).0 != 0;
        let ud = self
            .qps
            .get(&wc.qp_num)
            .is_some_and(|x| x.qp_type != QpType::Rc);
        Some(Completion {
            wr_id: w.user,
            status,
            opcode: if recv { WcOpcode::Recv } else { WcOpcode::Send },
            byte_len: if recv && ok { wc.len() as u32 } else { 0 },
            qp: if recv {
                qp
            } else {
                match w.owner {
                    Owner::Qp(q) => q,
                    Owner::Srq(_) => qp,
                }
            },
            buf: w.buf,
            imm,
            src_qp: (ok && recv && ud).then(|| QpNum::new(wc.src_qp)),
            grh,
        })
    }

    /// Whether the QP is in SQD and still draining (`ibv_qp_attr.sq_draining`).
    fn sq_draining(&self, raw: *mut ffi::ibv_qp) -> bool {
        // SAFETY: plain C structs; all-zero is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live QP and valid out pointers.
        let rc = unsafe {
            ffi::ibv_query_qp(
                raw,
                &mut attr,
                bit(ffi::ibv_qp_attr_mask::IBV_QP_STATE),
                &mut init,
            )
        };
        rc == 0 && attr.sq_draining != 0
    }

    fn query_state(&self, raw: *mut ffi::ibv_qp) -> Option<QpState> {
        // SAFETY: plain C structs; all-zero is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live QP and valid out pointers.
        let rc = unsafe {
            ffi::ibv_query_qp(
                raw,
                &mut attr,
                bit(ffi::ibv_qp_attr_mask::IBV_QP_STATE),
                &mut init,
            )
        };
        (rc == 0).then(|| state_from(attr.qp_state))
    }
}

impl Verbs for HwVerbs {
    fn port_attr(&self) -> PortAttr {
        self.attr
    }

    fn alloc_pd(&mut self) -> Result<PdId, VerbsError> {
        // SAFETY: valid context.
        let raw = unsafe { ffi::ibv_alloc_pd(self.ctx) };
        if raw.is_null() {
            return Err(errno_err("ibv_alloc_pd", -1));
        }
        let id = self.id();
        self.pds.insert(id, Pd { raw, users: 0 });
        Ok(PdId(id))
    }

    fn dealloc_pd(&mut self, pd: PdId) -> Result<(), VerbsError> {
        let p = self.pds.get(&pd.0).ok_or(VerbsError::NoSuchObject("PD"))?;
        // Pools (MRs) cannot be destroyed through the trait, so a PD with a pool stays busy.
        if p.users > 0 || self.mrs.values().any(|(_, d)| *d == pd) {
            return Err(VerbsError::Busy("PD"));
        }
        // SAFETY: a live PD with no objects.
        let rc = unsafe { ffi::ibv_dealloc_pd(p.raw) };
        if rc != 0 {
            return Err(errno_err("ibv_dealloc_pd", rc));
        }
        self.pds.remove(&pd.0);
        Ok(())
    }

    fn create_pool(
        &mut self,
        pd: PdId,
        buf_len: usize,
        count: usize,
    ) -> Result<PoolId, VerbsError> {
        let raw_pd = self.pd_raw(pd)?;
        let pool = self.pools.create(buf_len, count)?;
        let (base, len) = self
            .pools
            .region(pool)
            .ok_or(VerbsError::NoSuchObject("pool"))?;
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: `base..base+len` is the pool's heap memory, which never moves or shrinks
        // while `self` lives; the MR is deregistered in Drop before the pools are freed.
        let mr = unsafe { ffi::ibv_reg_mr(raw_pd, base.cast(), len, access) };
        if mr.is_null() {
            // The pool stays allocated (the trait cannot remove pools) but unregistered.
            return Err(errno_err("ibv_reg_mr", -1));
        }
        self.mrs.insert(pool, (mr, pd));
        Ok(pool)
    }

    fn pools(&self) -> &BufPools {
        &self.pools
    }

    fn pools_mut(&mut self) -> &mut BufPools {
        &mut self.pools
    }

    fn create_cq(&mut self, depth: u32) -> Result<CqId, VerbsError> {
        let n = i32::try_from(depth.max(1)).map_err(|_| VerbsError::OutOfResources("CQ"))?;
        // SAFETY: valid context and channel.
        let raw = unsafe { ffi::ibv_create_cq(self.ctx, n, ptr::null_mut(), self.channel, 0) };
        if raw.is_null() {
            return Err(errno_err("ibv_create_cq", -1));
        }
        // SAFETY: a live CQ of this context.
        if let Some(arm) = unsafe { (*self.ctx).ops.req_notify_cq } {
            // SAFETY: as above.
            unsafe { arm(raw, 0) };
        }
        let id = self.id();
        self.cqs.insert(id, Cq { raw, users: 0 });
        Ok(CqId(id))
    }

    fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        let c = self.cqs.get(&cq.0).ok_or(VerbsError::NoSuchObject("CQ"))?;
        if c.users > 0 {
            return Err(VerbsError::Busy("CQ"));
        }
        let raw = c.raw;
        // ibv_destroy_cq waits until every event it reported was acked.
        self.drain_channel();
        // SAFETY: a live CQ no QP uses, with all its events acked.
        let rc = unsafe { ffi::ibv_destroy_cq(raw) };
        if rc != 0 {
            return Err(errno_err("ibv_destroy_cq", rc));
        }
        self.cqs.remove(&cq.0);
        Ok(())
    }

    fn poll_cq(&mut self, cq: CqId, out: &mut Vec<Completion>, max: usize) -> usize {
        let Ok(raw) = self.cq_raw(cq) else {
            return 0;
        };
        let Some(poll) = (
            // SAFETY: valid context.
            unsafe { (*self.ctx).ops.poll_cq }
        ) else {
            return 0;
        };
        let mut got = 0;
        while got < max {
            let want = (max - got).min(64);
            if self.wc.len() < want {
                // SAFETY: ibv_wc is plain C data; all-zero is valid.
                self.wc.resize(want, unsafe { std::mem::zeroed() });
            }
            // SAFETY: a live CQ and room for `want` entries.
            let n = unsafe { poll(raw, want as i32, self.wc.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            for i in 0..n as usize {
                let wc = self.wc[i];
                if let Some(c) = self.map_wc(&wc) {
                    self.stats.completions += 1;
                    if c.status != WcStatus::Success {
                        self.stats.completion_errors += 1;
                    }
                    out.push(c);
                    got += 1;
                }
            }
            if (n as usize) < want {
                break;
            }
        }
        got
    }

    fn create_srq(&mut self, init: &SrqInit) -> Result<SrqId, VerbsError> {
        let raw_pd = self.pd_raw(init.pd)?;
        let mut a = ffi::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr: init.max_wr.max(1),
                max_sge: 1,
                srq_limit: init.limit,
            },
        };
        // SAFETY: valid PD and attribute struct.
        let raw = unsafe { ffi::ibv_create_srq(raw_pd, &mut a) };
        if raw.is_null() {
            return Err(errno_err("ibv_create_srq", -1));
        }
        let id = self.id();
        self.srqs.insert(
            id,
            Srq {
                raw,
                pd: init.pd,
                max_wr: init.max_wr.max(1),
                users: 0,
                posted: 0,
            },
        );
        self.use_pd(init.pd, 1);
        Ok(SrqId(id))
    }

    fn modify_srq(&mut self, srq: SrqId, limit: u32) -> Result<(), VerbsError> {
        let s = self
            .srqs
            .get(&srq.0)
            .ok_or(VerbsError::NoSuchObject("SRQ"))?;
        let mut a = ffi::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        // SAFETY: a live SRQ and attribute struct.
        let rc = unsafe { ffi::ibv_modify_srq(s.raw, &mut a, ffi::IBV_SRQ_LIMIT as i32) };
        if rc != 0 {
            return Err(errno_err("ibv_modify_srq", rc));
        }
        Ok(())
    }

    fn post_srq_recv(&mut self, srq: SrqId, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        let s = self
            .srqs
            .get(&srq.0)
            .ok_or(VerbsError::NoSuchObject("SRQ"))?;
        if s.posted >= s.max_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        self.post_recv_raw(Owner::Srq(srq), wr_id, buf)?;
        if let Some(s) = self.srqs.get_mut(&srq.0) {
            s.posted += 1;
        }
        Ok(())
    }

    fn destroy_srq(&mut self, srq: SrqId) -> Result<(), VerbsError> {
        let s = self
            .srqs
            .get(&srq.0)
            .ok_or(VerbsError::NoSuchObject("SRQ"))?;
        if s.users > 0 {
            return Err(VerbsError::Busy("SRQ"));
        }
        let (raw, pd) = (s.raw, s.pd);
        // SAFETY: a live SRQ no QP uses.
        let rc = unsafe { ffi::ibv_destroy_srq(raw) };
        if rc != 0 {
            return Err(errno_err("ibv_destroy_srq", rc));
        }
        self.srqs.remove(&srq.0);
        self.release_owner(Owner::Srq(srq));
        self.use_pd(pd, -1);
        Ok(())
    }

    fn create_qp(&mut self, init: &QpInit) -> Result<QpNum, VerbsError> {
        let qp_type = match init.qp_type {
            QpType::Rc => ffi::ibv_qp_type::IBV_QPT_RC,
            QpType::Ud => ffi::ibv_qp_type::IBV_QPT_UD,
            QpType::Gsi => return Err(VerbsError::OutOfResources("QP1 (owned by the kernel)")),
        };
        let raw_pd = self.pd_raw(init.pd)?;
        let scq = self.cq_raw(init.send_cq)?;
        let rcq = self.cq_raw(init.recv_cq)?;
        let srq = match init.srq {
            Some(s) => {
                self.srqs
                    .get(&s.0)
                    .ok_or(VerbsError::NoSuchObject("SRQ"))?
                    .raw
            }
            None => ptr::null_mut(),
        };
        let mut a = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: scq,
            recv_cq: rcq,
            srq,
            cap: ffi::ibv_qp_cap {
                max_send_wr: init.max_send_wr.max(1),
                max_recv_wr: if srq.is_null() {
                    init.max_recv_wr.max(1)
                } else {
                    0
                },
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type,
            sq_sig_all: i32::from(init.sq_sig_all),
        };
        // SAFETY: valid PD, CQs, SRQ (or null) and attribute struct.
        let raw = unsafe { ffi::ibv_create_qp(raw_pd, &mut a) };
        if raw.is_null() {
            return Err(errno_err("ibv_create_qp", -1));
        }
        // SAFETY: a live QP.
        let qpn = unsafe { (*raw).qp_num };
        self.qps.insert(
            qpn,
            Qp {
                raw,
                qp_type: init.qp_type,
                state: QpState::Reset,
                pd: init.pd,
                send_cq: init.send_cq,
                recv_cq: init.recv_cq,
                srq: init.srq,
                max_send_wr: init.max_send_wr.max(1),
                max_recv_wr: init.max_recv_wr.max(1),
                sq_sig_all: init.sq_sig_all,
                sends: VecDeque::new(),
                recvs: 0,
                mcast: Vec::new(),
            },
        );
        self.use_pd(init.pd, 1);
        self.use_cq(init.send_cq, 1);
        self.use_cq(init.recv_cq, 1);
        if let Some(s) = init.srq.and_then(|s| self.srqs.get_mut(&s.0)) {
            s.users += 1;
        }
        Ok(QpNum::new(qpn))
    }

    fn modify_qp(&mut self, qp: QpNum, attr: &QpAttr) -> Result<(), VerbsError> {
        let q = self.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
        let (raw, qp_type) = (q.raw, q.qp_type);
        let current = self.query_state(raw).unwrap_or(q.state);
        check_modify(qp_type, current, attr)?;
        if current == QpState::Sqd && !matches!(attr.state, Some(QpState::Err | QpState::Reset)) {
            // A device may refuse to leave SQD while the send queue is still draining (rxe
            // does, with EINVAL): wait for the drain, at most a second.
            for _ in 0..1000 {
                if !self.sq_draining(raw) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        use ffi::ibv_qp_attr_mask as M;
        // SAFETY: ibv_qp_attr is a plain C struct; all-zero is valid.
        let mut a: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        let mut mask = 0i32;
        let to = attr.state.unwrap_or(current);
        a.qp_state = state_to(to);
        mask |= bit(M::IBV_QP_STATE);
        if let Some(s) = attr.cur_state {
            a.cur_qp_state = state_to(s);
            mask |= bit(M::IBV_QP_CUR_STATE);
        }
        if let Some(v) = attr.pkey_index {
            a.pkey_index = v;
            mask |= bit(M::IBV_QP_PKEY_INDEX);
        }
        if let Some(v) = attr.port {
            a.port_num = v;
            mask |= bit(M::IBV_QP_PORT);
        }
        if let Some(v) = attr.qkey {
            a.qkey = v.0;
            mask |= bit(M::IBV_QP_QKEY);
        }
        if let Some(acc) = attr.access {
            use ffi::ibv_access_flags as F;
            let mut f = 0;
            if acc.remote_write {
                f |= F::IBV_ACCESS_REMOTE_WRITE.0;
            }
            if acc.remote_read {
                f |= F::IBV_ACCESS_REMOTE_READ.0;
            }
            if acc.remote_atomic {
                f |= F::IBV_ACCESS_REMOTE_ATOMIC.0;
            }
            a.qp_access_flags = f;
            mask |= bit(M::IBV_QP_ACCESS_FLAGS);
        }
        if let Some(av) = attr.av {
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = attr.port.unwrap_or(self.port);
            a.ah_attr.grh.dgid = ffi::ibv_gid { raw: av.dgid.0 };
            a.ah_attr.grh.sgid_index = self.gid_index;
            a.ah_attr.grh.hop_limit = av.hop_limit;
            a.ah_attr.grh.traffic_class = av.traffic_class;
            a.ah_attr.grh.flow_label = av.flow_label;
            mask |= bit(M::IBV_QP_AV);
        }
        if let Some(m) = attr.path_mtu {
            a.path_mtu = ffi::ibv_mtu::from(m.to_enum());
            mask |= bit(M::IBV_QP_PATH_MTU);
        }
        if let Some(v) = attr.dest_qpn {
            a.dest_qp_num = v.get();
            mask |= bit(M::IBV_QP_DEST_QPN);
        }
        if let Some(v) = attr.rq_psn {
            a.rq_psn = v.get();
            mask |= bit(M::IBV_QP_RQ_PSN);
        }
        if let Some(v) = attr.max_dest_rd_atomic {
            a.max_dest_rd_atomic = v;
            mask |= bit(M::IBV_QP_MAX_DEST_RD_ATOMIC);
        }
        if let Some(v) = attr.min_rnr_timer {
            a.min_rnr_timer = v;
            mask |= bit(M::IBV_QP_MIN_RNR_TIMER);
        }
        if let Some(v) = attr.timeout {
            a.timeout = v;
            mask |= bit(M::IBV_QP_TIMEOUT);
        }
        if let Some(v) = attr.retry_cnt {
            a.retry_cnt = v;
            mask |= bit(M::IBV_QP_RETRY_CNT);
        }
        if let Some(v) = attr.rnr_retry {
            a.rnr_retry = v;
            mask |= bit(M::IBV_QP_RNR_RETRY);
        }
        if let Some(v) = attr.sq_psn {
            a.sq_psn = v.get();
            mask |= bit(M::IBV_QP_SQ_PSN);
        }
        if let Some(v) = attr.max_rd_atomic {
            a.max_rd_atomic = v;
            mask |= bit(M::IBV_QP_MAX_QP_RD_ATOMIC);
        }
        if let Some(v) = attr.en_sqd_async_notify {
            a.en_sqd_async_notify = u8::from(v);
            mask |= bit(M::IBV_QP_EN_SQD_ASYNC_NOTIFY);
        }
        // SAFETY: a live QP and a filled attribute struct whose mask names the set fields.
        let rc = unsafe { ffi::ibv_modify_qp(raw, &mut a, mask) };
        if rc != 0 {
            return Err(errno_err("ibv_modify_qp", rc));
        }
        if let Some(q) = self.qps.get_mut(&qp.get()) {
            q.state = to;
            if to == QpState::Reset {
                // RESET discards every outstanding WR without completions.
                q.sends.clear();
                q.recvs = 0;
            }
        }
        if to == QpState::Reset {
            self.release_owner(Owner::Qp(qp));
        }
        Ok(())
    }

    fn query_qp_state(&self, qp: QpNum) -> Result<QpState, VerbsError> {
        let q = self.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
        Ok(self.query_state(q.raw).unwrap_or(q.state))
    }

    fn post_send(&mut self, qp: QpNum, wr: &SendWr) -> Result<(), VerbsError> {
        let q = self.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
        if !matches!(q.state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(VerbsError::InvalidState { qp, state: q.state });
        }
        if q.sends.len() >= q.max_send_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        let (raw, qp_type, pd, sig_all) = (q.raw, q.qp_type, q.pd, q.sq_sig_all);
        if qp_type != QpType::Rc {
            let mtu = self.attr.active_mtu.bytes();
            if wr.len > mtu {
                return Err(VerbsError::TooLong {
                    len: wr.len,
                    limit: mtu,
                });
            }
        } else if wr.len > self.attr.max_msg_size {
            return Err(VerbsError::TooLong {
                len: wr.len,
                limit: self.attr.max_msg_size,
            });
        }
        let ah = match (qp_type, wr.ud) {
            (QpType::Rc, _) => None,
            (_, Some(d)) => Some((self.ah_for(pd, d.av)?, d)),
            (_, None) => return Err(VerbsError::InvalidWr("UD send without a destination")),
        };
        let mut sge = match wr.buf {
            Some(b) => Some(self.sge(b, wr.len)?),
            None if wr.len > 0 => return Err(VerbsError::InvalidWr("length without a buffer")),
            None => None,
        };
        if let Some(b) = wr.buf {
            self.pools.lend(b)?;
        }
        let signaled = wr.signaled || sig_all;
        let id = self.new_wr(Wr {
            owner: Owner::Qp(qp),
            user: wr.wr_id,
            buf: wr.buf,
            send: true,
            signaled,
        });
        // SAFETY: ibv_send_wr is a plain C struct; all-zero is valid.
        let mut w: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = id;
        if let Some(s) = sge.as_mut() {
            w.sg_list = s;
            w.num_sge = 1;
        }
        w.opcode = if wr.imm.is_some() {
            ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
        } else {
            ffi::ibv_wr_opcode::IBV_WR_SEND
        };
        if let Some(imm) = wr.imm {
            w.__bindgen_anon_1.imm_data = imm.to_be();
        }
        // Every send is signaled on the device, so that an unsignaled WR (whose completion
        // the caller never sees) still tells us when its buffer is free again.
        let mut flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if wr.solicited {
            flags |= ffi::ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        w.send_flags = flags;
        if let Some((ah, d)) = ah {
            w.wr.ud = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
                ah,
                remote_qpn: d.remote_qpn.get(),
                remote_qkey: d.remote_qkey.0,
            };
        }
        let mut bad = ptr::null_mut();
        // SAFETY: a live QP of this context; `w` and `sge` outlive the call (the device copies
        // them); the SGE lies inside the pool's registered MR and the buffer is now lent.
        let rc = unsafe {
            match (*self.ctx).ops.post_send {
                Some(f) => f(raw, &mut w, &mut bad),
                None => libc::ENOSYS,
            }
        };
        if rc != 0 {
            self.wrs.remove(&id);
            if let Some(b) = wr.buf {
                self.pools.reclaim(b);
            }
            return Err(if rc == libc::ENOMEM {
                VerbsError::QueueFull
            } else {
                errno_err("post_send", rc)
            });
        }
        if let Some(q) = self.qps.get_mut(&qp.get()) {
            q.sends.push_back(id);
        }
        Ok(())
    }

    fn post_recv(&mut self, qp: QpNum, wr_id: WrId, buf: BufId) -> Result<(), VerbsError> {
        let q = self.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
        if q.srq.is_some() {
            return Err(VerbsError::UsesSrq(qp));
        }
        if q.state == QpState::Reset {
            return Err(VerbsError::InvalidState { qp, state: q.state });
        }
        if q.recvs >= q.max_recv_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        self.post_recv_raw(Owner::Qp(qp), wr_id, buf)?;
        if let Some(q) = self.qps.get_mut(&qp.get()) {
            q.recvs += 1;
        }
        Ok(())
    }

    fn destroy_qp(&mut self, qp: QpNum) -> Result<(), VerbsError> {
        let q = self.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
        let raw = q.raw;
        for g in q.mcast.clone() {
            let gid = ffi::ibv_gid { raw: g.0 };
            // SAFETY: a live QP attached to `gid`.
            unsafe { ffi::ibv_detach_mcast(raw, &gid, 0) };
        }
        // SAFETY: a live QP; nothing else refers to it.
        let rc = unsafe { ffi::ibv_destroy_qp(raw) };
        if rc != 0 {
            return Err(errno_err("ibv_destroy_qp", rc));
        }
        if let Some(q) = self.qps.remove(&qp.get()) {
            self.use_pd(q.pd, -1);
            self.use_cq(q.send_cq, -1);
            self.use_cq(q.recv_cq, -1);
            if let Some(s) = q.srq.and_then(|s| self.srqs.get_mut(&s.0)) {
                s.users = s.users.saturating_sub(1);
            }
        }
        self.release_owner(Owner::Qp(qp));
        Ok(())
    }

    fn qp_count(&self) -> usize {
        self.qps.len()
    }

    fn attach_mcast(&mut self, qp: QpNum, mgid: Gid) -> Result<(), VerbsError> {
        let q = self.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
        if q.qp_type == QpType::Rc {
            return Err(VerbsError::InvalidWr("multicast on a non-UD QP"));
        }
        if mgid.0[0] != 0xFF && !mgid.to_ip().is_multicast() {
            return Err(VerbsError::InvalidWr("not a multicast GID"));
        }
        let gid = ffi::ibv_gid { raw: mgid.0 };
        // SAFETY: a live UD QP and a GID.
        let rc = unsafe { ffi::ibv_attach_mcast(q.raw, &gid, 0) };
        if rc != 0 {
            return Err(errno_err("ibv_attach_mcast", rc));
        }
        if let Some(q) = self.qps.get_mut(&qp.get()) {
            q.mcast.push(mgid);
        }
        Ok(())
    }

    fn detach_mcast(&mut self, qp: QpNum, mgid: Gid) -> Result<(), VerbsError> {
        let q = self.qps.get(&qp.get()).ok_or(VerbsError::NoSuchQp(qp))?;
        if !q.mcast.contains(&mgid) {
            return Err(VerbsError::NoSuchObject("multicast attachment"));
        }
        let gid = ffi::ibv_gid { raw: mgid.0 };
        // SAFETY: a live QP attached to `gid`.
        let rc = unsafe { ffi::ibv_detach_mcast(q.raw, &gid, 0) };
        if rc != 0 {
            return Err(errno_err("ibv_detach_mcast", rc));
        }
        if let Some(q) = self.qps.get_mut(&qp.get()) {
            q.mcast.retain(|g| *g != mgid);
        }
        Ok(())
    }

    fn poll_async_event(&mut self) -> Option<AsyncEvent> {
        self.drain_async();
        self.events.pop_front()
    }
}

impl Provider for HwVerbs {
    type Verbs = Self;

    fn verbs(&mut self) -> &mut Self {
        self
    }

    fn register(&mut self, registry: &Registry, first_token: usize) -> io::Result<usize> {
        // SAFETY: the channel and context are live while `self` is.
        let (cfd, afd) = unsafe { ((*self.channel).fd, (*self.ctx).async_fd) };
        registry.register(&mut SourceFd(&cfd), Token(first_token), Interest::READABLE)?;
        registry.register(
            &mut SourceFd(&afd),
            Token(first_token + 1),
            Interest::READABLE,
        )?;
        Ok(2)
    }

    fn handle_io(&mut self, _now: Instant) -> io::Result<()> {
        self.drain_channel();
        self.drain_async();
        Ok(())
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
}

impl Drop for HwVerbs {
    fn drop(&mut self) {
        // Order matters: QPs, SRQs, CQs (events acked first), AHs, MRs, PDs, channel, context.
        // Errors are ignored: nothing can be done about them here.
        for (_, q) in self.qps.drain() {
            // SAFETY: live QP, destroyed once.
            unsafe { ffi::ibv_destroy_qp(q.raw) };
        }
        for (_, s) in self.srqs.drain() {
            // SAFETY: live SRQ with no QPs left.
            unsafe { ffi::ibv_destroy_srq(s.raw) };
        }
        self.drain_channel();
        for (_, c) in self.cqs.drain() {
            // SAFETY: live CQ with no QPs left and all events acked.
            unsafe { ffi::ibv_destroy_cq(c.raw) };
        }
        for (_, ah) in self.ahs.drain() {
            // SAFETY: live AH.
            unsafe { ffi::ibv_destroy_ah(ah) };
        }
        for (_, (mr, _)) in self.mrs.drain() {
            // SAFETY: live MR over pool memory that is still allocated (pools drop after us).
            unsafe { ffi::ibv_dereg_mr(mr) };
        }
        for (_, p) in self.pds.drain() {
            // SAFETY: live PD with no objects left.
            unsafe { ffi::ibv_dealloc_pd(p.raw) };
        }
        if !self.channel.is_null() {
            // SAFETY: live channel with no CQs left.
            unsafe { ffi::ibv_destroy_comp_channel(self.channel) };
        }
        if !self.ctx.is_null() {
            // SAFETY: live context with no objects left.
            unsafe { ffi::ibv_close_device(self.ctx) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without an RDMA device (CI), opening fails cleanly with `NoDevice`.
    #[test]
    fn open_without_device_is_a_clean_error() {
        if std::path::Path::new("/sys/class/infiniband_verbs").exists() {
            return;
        }
        match HwVerbs::open(&HwConfig::default()) {
            Err(e @ HwError::NoDevice(_)) => assert!(e.to_string().starts_with("no RDMA device")),
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("opened a device on a machine without RDMA"),
        }
    }
}
