//! The device context: opening it (device, port, GID index, completion channel, async fd)
//! and closing it with everything it still holds.

use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;
use std::ptr;

use super::ah_cache::{AhCache, MAX_CACHED_AHS, MAX_RETIRED_AHS};
use super::commands::QpCommands;
use super::ffi_map::mtu_from;
use super::objects::WrTable;
use super::{HwConfig, HwError, HwStats, HwVerbs};
use crate::verbs::{BufPools, Gid, PathMtu, PortAttr};
use ibverbs_sys as ffi;

/// Reads `/sys/class/infiniband/DEV/ports/PORT/gid_attrs/types/IDX` ("RoCE v2", "IB/RoCE v1").
fn gid_type(dev: &str, port: u8, idx: i32) -> Option<String> {
    let p = format!("/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{idx}");
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned())
}

pub(super) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
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

impl HwVerbs {
    /// Opens the device, queries the port and picks the GID index.
    ///
    /// # Errors
    /// An error that [`HwError::is_no_device`] when there is no RDMA stack or no (such)
    /// device; another [`HwError`] naming the step when opening it fails.
    pub fn open(cfg: &HwConfig) -> Result<Self, HwError> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out pointer; the list is freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(HwError::NoRdmaStack(io::Error::last_os_error()));
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
        let open_err = io::Error::last_os_error();
        // SAFETY: the list came from ibv_get_device_list; opened contexts stay valid.
        unsafe { ffi::ibv_free_device_list(list) };
        if found.is_null() {
            return Err(match &cfg.device {
                Some(d) => HwError::NotFound {
                    name: d.clone(),
                    available: names,
                },
                None => HwError::NoDevices,
            });
        }
        if ctx.is_null() {
            return Err(HwError::Open(open_err));
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
                lids: None,
            },
            name: name.clone(),
            pools: BufPools::new(),
            mrs: HashMap::new(),
            pds: HashMap::new(),
            cqs: HashMap::new(),
            srqs: HashMap::new(),
            qps: HashMap::new(),
            ahs: AhCache::new(MAX_CACHED_AHS, MAX_RETIRED_AHS),
            wrs: WrTable::default(),
            chained: Vec::new(),
            readiness: None,
            next_comp_vector: 0,
            next_id: 1,
            events: VecDeque::new(),
            wc: Vec::new(),
            stats: HwStats::default(),
            commands: QpCommands::new(),
            moving_qps: 0,
            next_moves: 0,
            moved: VecDeque::new(),
            ipv4_joins: Default::default(),
            infiniband: false,
            cfg: HwConfig {
                device: Some(name.clone()),
                ..cfg.clone()
            },
        };
        v.init(cfg)?;
        Ok(v)
    }

    /// `ibv_query_port` of the port in use; the context must be open.
    fn query_port(&self) -> Result<ffi::ibv_port_attr, HwError> {
        // SAFETY: ibv_port_attr is a plain C struct; all-zero is valid.
        let mut pa: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open (the callers' invariant); the exported ibv_query_port
        // writes a full `ibv_port_attr` through the provider's query_port (the `_compat` type
        // only names the older, smaller prefix).
        let rc = unsafe { ffi::ibv_query_port(self.ctx, self.port, (&raw mut pa).cast()) };
        if rc != 0 {
            return Err(HwError::QueryPort {
                device: self.name.clone(),
                port: self.port,
                source: io::Error::from_raw_os_error(rc.abs()),
            });
        }
        Ok(pa)
    }

    fn init(&mut self, cfg: &HwConfig) -> Result<(), HwError> {
        let pa = self.query_port()?;
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
            .ok_or_else(|| HwError::EmptyGid {
                device: self.name.clone(),
                port: self.port,
                index: self.gid_index,
            })?;
        self.attr = PortAttr {
            gid,
            active_mtu: mtu_from(pa.active_mtu),
            max_mtu: mtu_from(pa.max_mtu),
            max_msg_size: pa.max_msg_sz as usize,
            active: pa.state == ffi::ibv_port_state::IBV_PORT_ACTIVE,
            lids: None,
        };
        self.infiniband = u32::from(pa.link_layer) == ffi::IBV_LINK_LAYER_INFINIBAND;
        // SAFETY: valid context.
        self.channel = unsafe { ffi::ibv_create_comp_channel(self.ctx) };
        if self.channel.is_null() {
            return Err(HwError::CompChannel(io::Error::last_os_error()));
        }
        // SAFETY: the channel and the context are valid; their fds are theirs.
        let (cfd, afd) = unsafe { ((*self.channel).fd, (*self.ctx).async_fd) };
        set_nonblocking(cfd)
            .and_then(|()| set_nonblocking(afd))
            .map_err(HwError::NonBlocking)?;
        Ok(())
    }

    /// The device name.
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// The CQs created from now on take the device's completion vectors in turn from
    /// `first` (modulo their number): worker `w` of an interface starts at `w`, so that the
    /// workers' interrupts land on different vectors.
    pub fn set_first_comp_vector(&mut self, first: u8) {
        self.next_comp_vector = i32::from(first);
    }

    /// The port number in use.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// Whether the port's link layer is InfiniBand (an SM and an SA serve it), not RoCE.
    pub fn is_infiniband(&self) -> bool {
        self.infiniband
    }

    /// The GID index in use.
    pub fn gid_index(&self) -> u8 {
        self.gid_index
    }

    /// What the provider counted so far.
    pub fn stats(&self) -> HwStats {
        let mut s = self.stats;
        let c = self.commands.counts;
        s.qps_created_off_loop = c.created;
        s.qps_destroyed_off_loop = c.destroyed;
        s.qp_modifies_off_loop = c.modified;
        s.qp_commands_failed_off_loop = c.failed;
        let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        s.qp_create_us_off_loop = us(c.create_time);
        s.qp_modify_us_off_loop = us(c.modify_time);
        s.qp_destroy_us_off_loop = us(c.destroy_time);
        s.qps_ready_ahead = self.commands.ready() as u64;
        s
    }

    /// QPs that exist now (created and not yet destroyed).
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    pub(super) fn id(&mut self) -> u32 {
        let i = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        i
    }
}

impl Drop for HwVerbs {
    fn drop(&mut self) {
        self.close_context();
    }
}

impl HwVerbs {
    /// `Err(DeviceLost)` while the context is closed (`HwVerbs::close_context`).
    /// Reads the port's MTUs and state again (on RoCE the active MTU follows the netdev's
    /// MTU; on InfiniBand the SM's); the GID stays the one chosen at open. Nothing when the
    /// context is lost.
    ///
    /// # Errors
    /// `ibv_query_port` failed.
    pub fn refresh_port_attr(&mut self) -> Result<(), HwError> {
        if self.ctx.is_null() {
            return Ok(());
        }
        let pa = self.query_port()?;
        self.attr.active_mtu = mtu_from(pa.active_mtu);
        self.attr.max_mtu = mtu_from(pa.max_mtu);
        self.attr.active = pa.state == ffi::ibv_port_state::IBV_PORT_ACTIVE;
        Ok(())
    }

    pub(super) fn open_context(&self) -> Result<(), crate::verbs::VerbsError> {
        if self.ctx.is_null() {
            Err(crate::verbs::VerbsError::DeviceLost)
        } else {
            Ok(())
        }
    }

    /// Destroys every object and closes the context (nothing when it is closed already); the
    /// provider then holds no object, reads no descriptor ([`Provider::io_source`] names
    /// none) and fails the verbs that need a context with [`VerbsError::DeviceLost`].
    ///
    /// [`Provider::io_source`]: crate::verbs::Provider::io_source
    /// [`VerbsError::DeviceLost`]: crate::verbs::VerbsError::DeviceLost
    pub(super) fn close_context(&mut self) {
        // The command thread's jobs name this context's objects.
        self.commands.quiesce();
        while self.commands.take_moved().is_some() {}
        self.moved.clear();
        self.moving_qps = 0;
        self.chained.clear();
        self.events.clear();
        self.readiness = None;
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
            if c.unacked_events > 0 {
                // SAFETY: live CQ; these events were read from the channel.
                unsafe { ffi::ibv_ack_cq_events(c.raw, c.unacked_events) };
            }
            // SAFETY: live CQ with no QPs left and all events acked.
            unsafe { ffi::ibv_destroy_cq(c.raw) };
        }
        for ah in self.ahs.drain() {
            // SAFETY: live AH, destroyed once; no QP is left to use it.
            unsafe { ffi::ibv_destroy_ah(ah.raw) };
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
            self.channel = ptr::null_mut();
        }
        if !self.ctx.is_null() {
            // SAFETY: live context with no objects left.
            unsafe { ffi::ibv_close_device(self.ctx) };
            self.ctx = ptr::null_mut();
        }
    }
}
