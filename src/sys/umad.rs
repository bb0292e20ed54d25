//! `/dev/infiniband/umadN`: a MAD agent on QP1 for one management class, sending and receiving
//! non-blocking, plus the port attributes sysfs gives.
//!
//! Every call goes through libc's `open`, `read`, `write`, `ioctl`, `poll` and `close` (never
//! Rust's `std::fs`, which opens with `open64`), so ibsim's `umad2sim` preload, which wraps
//! exactly those symbols, carries them to a simulated fabric unchanged. Two things differ
//! there, and both are handled here: its descriptors (1024 and up) are no kernel descriptors
//! (they work with `poll(2)`, which it wraps, but not with epoll; [`Umad::wait_readable`] is
//! the way to wait on them), and its `read` of an empty queue returns `-EWOULDBLOCK` itself
//! instead of `-1` with `errno`.
//!
//! An agent names one class. With an empty method mask (the SA client: class 0x03 version 2) the
//! kernel (and `umad2sim`) deliver only responses to its own requests, matched by the high 32
//! bits of the transaction ID, which they overwrite with the agent's; this coexists with the
//! kernel's `ib_sa`, as `saquery` does. With methods in the mask (the CM: class 0x07 version 2,
//! method Send) the agent is a *server*: the kernel's MAD layer hands it every unsolicited MAD
//! of those methods, and only one agent per port may hold a (class, method) pair (`ib_cm`
//! holds the CM's while it is loaded: registering then fails with `EINVAL`,
//! `method_in_use()` in `drivers/infiniband/core/mad.c`). The kernel overwrites the high 32
//! bits of the transaction ID of every non-response MAD sent (`ib_umad_write`), which the CM
//! tolerates: it matches messages by communication ID, never by transaction ID.
//!
//! Two header layouts exist ([`HdrAbi`]): the 56-byte one without `pkey_index` (the SA
//! agent's, all `umad2sim` speaks) and the 64-byte one after `IB_USER_MAD_ENABLE_PKEY` (the CM
//! agent's, which sends on the P_Key index of the endpoint's partition).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// Size of every MAD this agent sends and receives (no RMPP).
pub(crate) const MAD_LEN: usize = 256;

/// `IB_IOCTL_MAGIC`.
const IB_IOCTL_MAGIC: libc::c_ulong = 0x1b;
/// `IB_USER_MAD_REGISTER_AGENT`: `_IOWR(0x1b, 1, struct ib_user_mad_reg_req)` (28 bytes).
const IB_USER_MAD_REGISTER_AGENT: libc::c_ulong =
    (3 << 30) | ((size_of::<RegReq>() as libc::c_ulong) << 16) | (IB_IOCTL_MAGIC << 8) | 1;
/// `IB_USER_MAD_UNREGISTER_AGENT`: `_IOW(0x1b, 2, __u32)`.
const IB_USER_MAD_UNREGISTER_AGENT: libc::c_ulong =
    (1 << 30) | (4 << 16) | (IB_IOCTL_MAGIC << 8) | 2;
/// `IB_USER_MAD_ENABLE_PKEY`: `_IO(0x1b, 3)` (`rdma/rdma_user_ioctl.h`); must come before the
/// first agent is registered.
const IB_USER_MAD_ENABLE_PKEY: libc::c_ulong = (IB_IOCTL_MAGIC << 8) | 3;

/// `struct ib_user_mad_reg_req`.
#[repr(C)]
#[derive(Default)]
struct RegReq {
    id: u32,
    method_mask: [u32; 4],
    qpn: u8,
    mgmt_class: u8,
    mgmt_class_version: u8,
    oui: [u8; 3],
    rmpp_version: u8,
}

/// Size of `struct ib_user_mad_hdr_old`, the header without `pkey_index`: what the kernel
/// uses unless `IB_USER_MAD_ENABLE_PKEY` is called, and all `umad2sim` speaks (it sizes
/// headers with libibumad's `umad_size()` in a process where libibumad never enabled P_Key
/// indices). SA MADs therefore go out on P_Key index 0, the default partition's slot.
pub(crate) const UMAD_HDR_LEN: usize = 56;

/// Size of `struct ib_user_mad_hdr` with `pkey_index` (and 6 reserved bytes).
pub(crate) const UMAD_HDR_PKEY_LEN: usize = 64;

/// Which `ib_user_mad_hdr` layout a umad file speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HdrAbi {
    /// 56 bytes, no `pkey_index` (index 0 is used).
    Old,
    /// 64 bytes with `pkey_index` (`IB_USER_MAD_ENABLE_PKEY`).
    WithPkey,
}

impl HdrAbi {
    /// Bytes of header before the MAD.
    pub(crate) fn len(self) -> usize {
        match self {
            Self::Old => UMAD_HDR_LEN,
            Self::WithPkey => UMAD_HDR_PKEY_LEN,
        }
    }
}

/// The GRH part of a umad address (`grh_present` set): on RoCE every MAD has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UmadGrh {
    /// Sending: our source GID's index in the port's table. Receiving: the index of the GID
    /// the MAD was addressed to.
    pub gid_index: u8,
    /// Hop limit (IPv6) or TTL (RoCEv2 over IPv4).
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Sending: the destination GID. Receiving: the sender's GID.
    pub gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
}

/// The address fields of `struct ib_user_mad_hdr`: where a MAD goes, or where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UmadAddr {
    /// The remote QPN (1 for QP1).
    pub qpn: u32,
    /// The remote Q_Key (QP1's is `0x8001_0000`); zero on receive.
    pub qkey: u32,
    /// The remote LID (IB; 0 on RoCE).
    pub lid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub path_bits: u8,
    /// The GRH, when there is one.
    pub grh: Option<UmadGrh>,
    /// The P_Key index ([`HdrAbi::WithPkey`] only; 0 otherwise).
    pub pkey_index: u16,
}

impl UmadAddr {
    /// QP1 of `lid` on `sl` with `qkey`, no GRH, P_Key index 0 (an IB subnet-local MAD).
    pub(crate) fn to_lid(lid: u16, sl: u8, qkey: u32) -> Self {
        Self {
            qpn: 1,
            qkey,
            lid,
            sl,
            path_bits: 0,
            grh: None,
            pkey_index: 0,
        }
    }
}

/// `struct ib_user_mad_hdr` (the fields the kernel reads or writes; the rest are zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UmadHdr {
    /// The agent ID.
    pub agent: u32,
    /// Receive: 0, or the errno of a send of ours that failed (e.g. `ETIMEDOUT`).
    pub status: u32,
    /// Send: how long the kernel waits for a response (0: none is expected).
    pub timeout_ms: u32,
    /// Send: how often the kernel resends while no response came.
    pub retries: u32,
    /// Receive: the MAD's length.
    pub length: u32,
    /// The address.
    pub addr: UmadAddr,
}

impl UmadHdr {
    /// The header in the kernel's layout; the first [`HdrAbi::len`] bytes are the ones sent.
    pub(crate) fn encode(&self) -> [u8; UMAD_HDR_PKEY_LEN] {
        let mut h = [0u8; UMAD_HDR_PKEY_LEN];
        let a = &self.addr;
        h[0..4].copy_from_slice(&self.agent.to_ne_bytes());
        h[4..8].copy_from_slice(&self.status.to_ne_bytes());
        h[8..12].copy_from_slice(&self.timeout_ms.to_ne_bytes());
        h[12..16].copy_from_slice(&self.retries.to_ne_bytes());
        h[16..20].copy_from_slice(&self.length.to_ne_bytes());
        h[20..24].copy_from_slice(&a.qpn.to_be_bytes());
        h[24..28].copy_from_slice(&a.qkey.to_be_bytes());
        h[28..30].copy_from_slice(&a.lid.to_be_bytes());
        h[30] = a.sl;
        h[31] = a.path_bits;
        if let Some(g) = &a.grh {
            h[32] = 1;
            h[33] = g.gid_index;
            h[34] = g.hop_limit;
            h[35] = g.traffic_class;
            h[36..52].copy_from_slice(&g.gid);
            h[52..56].copy_from_slice(&g.flow_label.to_be_bytes());
        }
        h[56..58].copy_from_slice(&a.pkey_index.to_ne_bytes());
        h
    }

    /// Reads a header of layout `abi` from the start of `b`; `None` when `b` is shorter.
    pub(crate) fn decode(b: &[u8], abi: HdrAbi) -> Option<Self> {
        let h = b.get(..abi.len())?;
        let u32_ne = |o: usize| h.get(o..o + 4)?.try_into().ok().map(u32::from_ne_bytes);
        let u32_be = |o: usize| h.get(o..o + 4)?.try_into().ok().map(u32::from_be_bytes);
        let grh = (h[32] != 0).then(|| UmadGrh {
            gid_index: h[33],
            hop_limit: h[34],
            traffic_class: h[35],
            gid: h[36..52].try_into().unwrap_or_default(),
            flow_label: u32_be(52).unwrap_or(0),
        });
        let pkey_index = match abi {
            HdrAbi::Old => 0,
            HdrAbi::WithPkey => u16::from_ne_bytes([h[56], h[57]]),
        };
        Some(Self {
            agent: u32_ne(0)?,
            status: u32_ne(4)?,
            timeout_ms: u32_ne(8)?,
            retries: u32_ne(12)?,
            length: u32_ne(16)?,
            addr: UmadAddr {
                qpn: u32_be(20)?,
                qkey: u32_be(24)?,
                lid: u16::from_be_bytes([h[28], h[29]]),
                sl: h[30],
                path_bits: h[31],
                grh,
                pkey_index,
            },
        })
    }
}

/// What an agent registers for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AgentSpec {
    /// The QP the agent sends and receives on: 0 for subnet management, 1 for the rest.
    pub qpn: u8,
    /// The management class (SA 0x03, CM 0x07, directed-route SMPs 0x81).
    pub mgmt_class: u8,
    /// Its version (2 for both).
    pub class_version: u8,
    /// Methods whose unsolicited MADs this agent serves (bit N: method N); all zero for a
    /// client that only gets responses to its own requests.
    pub method_mask: [u32; 4],
    /// The header layout (see [`HdrAbi`]).
    pub abi: HdrAbi,
}

impl AgentSpec {
    /// A client of `mgmt_class` (responses only), old header: the SA agent.
    pub(crate) fn client(mgmt_class: u8, class_version: u8) -> Self {
        Self {
            qpn: 1,
            mgmt_class,
            class_version,
            method_mask: [0; 4],
            abi: HdrAbi::Old,
        }
    }

    /// A server of `methods` of `mgmt_class`, with P_Key indices: the CM agent.
    pub(crate) fn server(mgmt_class: u8, class_version: u8, methods: &[u8]) -> Self {
        let mut method_mask = [0u32; 4];
        for &m in methods {
            if let Some(w) = method_mask.get_mut(usize::from(m / 32)) {
                *w |= 1 << (m % 32);
            }
        }
        Self {
            qpn: 1,
            mgmt_class,
            class_version,
            method_mask,
            abi: HdrAbi::WithPkey,
        }
    }

    /// A client of subnet management class `mgmt_class` (directed-route SMPs: 0x81,
    /// version 1) on QP0 (responses only), old header: what asks a port's own SMA.
    pub(crate) fn smi(mgmt_class: u8, class_version: u8) -> Self {
        Self {
            qpn: 0,
            ..Self::client(mgmt_class, class_version)
        }
    }
}

/// How long the kernel waits for the response of one send before it reports the send
/// timed out (the client's own retransmission runs on top).
const SEND_TIMEOUT_MS: u32 = 1000;

/// What [`Umad::recv`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UmadRecv {
    /// A MAD, in the caller's buffer, from this address.
    Mad(UmadAddr),
    /// The kernel reports a send of ours failed (status is an errno, e.g. `ETIMEDOUT`).
    SendFailed(u32),
}

/// One InfiniBand port as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UmadPort {
    /// The `umadN` index.
    pub umad: u32,
    /// The device name (`mlx5_0`, `ibsim0`).
    pub ca: String,
    /// The port number.
    pub port: u8,
    /// The port's LID.
    pub lid: u16,
    /// The SM's LID.
    pub sm_lid: u16,
    /// The SL to the SM.
    pub sm_sl: u8,
    /// The port's GID at index 0.
    pub gid: [u8; 16],
    /// Whether the port is ACTIVE.
    pub active: bool,
}

/// Reads a small sysfs file through libc (so `umad2sim` can redirect it).
fn read_small(path: &str) -> io::Result<String> {
    let c = CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its whole length; `fd` is open.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    let err = io::Error::last_os_error();
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    let n = usize::try_from(n).map_err(|_| err)?;
    let text = buf.get(..n).unwrap_or_default();
    Ok(String::from_utf8_lossy(text).trim().to_owned())
}

fn parse_num(s: &str) -> Option<u32> {
    let s = s.split(':').next()?.trim();
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn bad(what: &str, path: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{path}: bad {what}"))
}

/// The first `umadN` (`N` < 32) of device `ca` and port `port` (each if given), with its
/// device name and port number, from `/sys/class/infiniband_mad/umadN/{ibdev,port}`.
pub(crate) fn find_umad(ca: Option<&str>, port: Option<u8>) -> io::Result<(u32, String, u8)> {
    for umad in 0..32 {
        let base = format!("/sys/class/infiniband_mad/umad{umad}");
        let Ok(dev) = read_small(&format!("{base}/ibdev")) else {
            continue;
        };
        let p = read_small(&format!("{base}/port"))?;
        let p = parse_num(&p)
            .and_then(|v| u8::try_from(v).ok())
            .ok_or_else(|| bad("port", &base))?;
        if ca.is_some_and(|c| c != dev) || port.is_some_and(|q| q != p) {
            continue;
        }
        return Ok((umad, dev, p));
    }
    let what = match (ca, port) {
        (Some(c), Some(p)) => format!(" for {c} port {p}"),
        (Some(c), None) => format!(" for {c}"),
        _ => String::new(),
    };
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "no InfiniBand umad port{what} (/sys/class/infiniband_mad/umad*; is ib_umad loaded?)"
        ),
    ))
}

/// Whether port `port` of `ca` is RoCE (`link_layer` reads `Ethernet`) rather than
/// InfiniBand.
pub(crate) fn link_layer_is_ethernet(ca: &str, port: u8) -> io::Result<bool> {
    let ll = read_small(&format!(
        "/sys/class/infiniband/{ca}/ports/{port}/link_layer"
    ))?;
    Ok(ll.eq_ignore_ascii_case("ethernet"))
}

impl UmadPort {
    /// The first umad port (of `ca`, and `port` if given), `umad0` to `umad31`.
    pub(crate) fn find(ca: Option<&str>, port: Option<u8>) -> io::Result<Self> {
        let (umad, dev, p) = find_umad(ca, port)?;
        Self::read(umad, dev, p)
    }

    fn read(umad: u32, ca: String, port: u8) -> io::Result<Self> {
        let base = format!("/sys/class/infiniband/{ca}/ports/{port}");
        let num = |name: &str| -> io::Result<u32> {
            let path = format!("{base}/{name}");
            parse_num(&read_small(&path)?).ok_or_else(|| bad(name, &path))
        };
        let gid_path = format!("{base}/gids/0");
        let gid_text = read_small(&gid_path)?;
        let gid = gid_text
            .parse::<std::net::Ipv6Addr>()
            .map(|a| a.octets())
            .map_err(|_| bad("GID", &gid_path))?;
        Ok(Self {
            umad,
            lid: u16::try_from(num("lid")?).unwrap_or(0),
            sm_lid: u16::try_from(num("sm_lid")?).unwrap_or(0),
            sm_sl: u8::try_from(num("sm_sl")?).unwrap_or(0),
            active: num("state")? == 4,
            gid,
            ca,
            port,
        })
    }
}

/// Whether a kernel ipoib interface runs on port `port` of `ca` in partition `pkey` (either
/// membership bit): an ARPHRD_INFINIBAND netdev under `net_root` (`/sys/class/net`) whose
/// device is `ca`, whose `dev_port` is `port - 1` (ipoib's `dev->dev_port = port - 1`) and
/// whose `pkey` matches. Such an interface holds SA memberships of the port that a DELETE
/// of ours would remove.
pub(crate) fn kernel_ipoib_on(net_root: &str, ca: &str, port: u8, pkey: u16) -> bool {
    let Ok(dir) = std::fs::read_dir(net_root) else {
        return false;
    };
    // Bounded by the host's interfaces.
    dir.flatten().any(|e| {
        let base = e.path();
        let read = |name: &str| {
            std::fs::read_to_string(base.join(name))
                .ok()
                .and_then(|t| parse_num(t.trim()))
        };
        read("type") == Some(32)
            && base.join("device/infiniband").join(ca).exists()
            && read("dev_port") == Some(u32::from(port.saturating_sub(1)))
            && read("pkey").is_some_and(|k| k | 0x8000 == u32::from(pkey) | 0x8000)
    })
}

/// An open umad device with one agent registered.
#[derive(Debug)]
pub(crate) struct Umad {
    fd: RawFd,
    agent: u32,
    abi: HdrAbi,
}

/// Why [`Umad::open_agent`] failed: which step, and the OS error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UmadOpenError {
    /// `/dev/infiniband/umadN` did not open.
    #[error("open: {0}")]
    Open(#[source] io::Error),
    /// `IB_USER_MAD_ENABLE_PKEY` failed.
    #[error("enabling P_Key indices: {0}")]
    EnablePkey(#[source] io::Error),
    /// `IB_USER_MAD_REGISTER_AGENT` failed (`EINVAL` for a server agent: another agent on the
    /// port holds a method of the class).
    #[error("registering the agent: {0}")]
    Register(#[source] io::Error),
}

impl UmadOpenError {
    /// The step that failed, as words, and its OS error.
    pub(crate) fn into_step(self) -> (&'static str, io::Error) {
        match self {
            Self::Open(e) => ("open", e),
            Self::EnablePkey(e) => ("enabling P_Key indices", e),
            Self::Register(e) => ("registering the agent", e),
        }
    }
}

impl Umad {
    /// Opens `/dev/infiniband/umad<N>` non-blocking and registers an agent on QP1 for the
    /// responses of management class `mgmt_class`, version `class_version` (the SA: 0x03,
    /// 2), with the 56-byte header of [`UMAD_HDR_LEN`].
    pub(crate) fn open(umad: u32, mgmt_class: u8, class_version: u8) -> io::Result<Self> {
        Self::open_agent(umad, &AgentSpec::client(mgmt_class, class_version)).map_err(|e| match e {
            UmadOpenError::Open(e) | UmadOpenError::EnablePkey(e) | UmadOpenError::Register(e) => e,
        })
    }

    /// Opens `/dev/infiniband/umad<N>` non-blocking and registers the agent `spec` names on
    /// QP1.
    pub(crate) fn open_agent(umad: u32, spec: &AgentSpec) -> Result<Self, UmadOpenError> {
        let path = CString::new(format!("/dev/infiniband/umad{umad}"))
            .map_err(|_| UmadOpenError::Open(io::Error::from(io::ErrorKind::InvalidInput)))?;
        // SAFETY: `path` is NUL-terminated and outlives the call.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(UmadOpenError::Open(io::Error::last_os_error()));
        }
        // From here on `Drop` closes `fd` (agent u32::MAX: none registered yet).
        let mut me = Self {
            fd,
            agent: u32::MAX,
            abi: spec.abi,
        };
        if spec.abi == HdrAbi::WithPkey {
            // SAFETY: an argument-less ioctl on our open descriptor.
            let rc = unsafe { libc::ioctl(fd, IB_USER_MAD_ENABLE_PKEY as _) };
            if rc < 0 {
                return Err(UmadOpenError::EnablePkey(io::Error::last_os_error()));
            }
        }
        let mut req = RegReq {
            qpn: spec.qpn,
            mgmt_class: spec.mgmt_class,
            mgmt_class_version: spec.class_version,
            method_mask: spec.method_mask,
            ..RegReq::default()
        };
        // SAFETY: `req` is a live, writable `ib_user_mad_reg_req` the kernel fills in.
        let rc = unsafe { libc::ioctl(fd, IB_USER_MAD_REGISTER_AGENT as _, &raw mut req) };
        if rc < 0 {
            return Err(UmadOpenError::Register(io::Error::last_os_error()));
        }
        me.agent = req.id;
        Ok(me)
    }

    /// Sends `mad` to `to`. With `timeout_ms` nonzero the kernel keeps the send that long to
    /// match a response to it (a response to a send it no longer holds is dropped, and a
    /// send whose response never came is reported by [`Umad::recv`]); the SA client uses
    /// [`SEND_TIMEOUT_MS`], the CM 0 (its MADs are no requests the kernel could match).
    pub(crate) fn send(
        &self,
        mad: &[u8; MAD_LEN],
        to: &UmadAddr,
        timeout_ms: u32,
    ) -> io::Result<()> {
        let hdr = UmadHdr {
            agent: self.agent,
            status: 0,
            timeout_ms,
            retries: 0,
            length: MAD_LEN as u32,
            addr: *to,
        }
        .encode();
        let hl = self.abi.len();
        let mut b = [0u8; UMAD_HDR_PKEY_LEN + MAD_LEN];
        b[..hl].copy_from_slice(&hdr[..hl]);
        b[hl..hl + MAD_LEN].copy_from_slice(mad);
        let out = &b[..hl + MAD_LEN];
        // SAFETY: `out` is readable for its whole length; `fd` is open.
        let n = unsafe { libc::write(self.fd, out.as_ptr().cast(), out.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `mad` to QP1 of `dlid` on `sl` with `qkey`, no GRH, P_Key index 0, kept
    /// [`SEND_TIMEOUT_MS`] for its response (the SA client's requests).
    pub(crate) fn send_request(
        &self,
        mad: &[u8; MAD_LEN],
        dlid: u16,
        sl: u8,
        qkey: u32,
    ) -> io::Result<()> {
        self.send(mad, &UmadAddr::to_lid(dlid, sl, qkey), SEND_TIMEOUT_MS)
    }

    /// Sends the directed-route SMP `mad` to the port's own SMA (QP0 at the permissive LID
    /// 0xFFFF, hop count 0 in the SMP), kept [`SEND_TIMEOUT_MS`] for its response.
    pub(crate) fn send_smp_local(&self, mad: &[u8; MAD_LEN]) -> io::Result<()> {
        let to = UmadAddr {
            qpn: 0,
            qkey: 0,
            ..UmadAddr::to_lid(0xFFFF, 0, 0)
        };
        self.send(mad, &to, SEND_TIMEOUT_MS)
    }

    /// One MAD into `mad` if one is queued; `Ok(None)` when none is.
    pub(crate) fn recv(&self, mad: &mut [u8; MAD_LEN]) -> io::Result<Option<UmadRecv>> {
        let mut b = [0u8; UMAD_HDR_PKEY_LEN + MAD_LEN];
        let hl = self.abi.len();
        let buf = &mut b[..hl + MAD_LEN];
        // SAFETY: `buf` is writable for its whole length; `fd` is open.
        let n = unsafe { libc::read(self.fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n == -1 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        // umad2sim answers an empty queue with -EWOULDBLOCK as the return value.
        let Ok(n) = usize::try_from(n) else {
            return Ok(None);
        };
        let Some(hdr) = UmadHdr::decode(buf.get(..n).unwrap_or_default(), self.abi) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "short umad read",
            ));
        };
        if hdr.status != 0 {
            return Ok(Some(UmadRecv::SendFailed(hdr.status)));
        }
        // The 24-byte common MAD header at least.
        if n < hl + 24 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "short umad read",
            ));
        }
        *mad = [0u8; MAD_LEN];
        let got = (n - hl).min(MAD_LEN);
        if let (Some(dst), Some(src)) = (mad.get_mut(..got), buf.get(hl..hl + got)) {
            dst.copy_from_slice(src);
        }
        Ok(Some(UmadRecv::Mad(hdr.addr)))
    }

    /// Waits up to `timeout` for a MAD to read (`poll(2)`, which `umad2sim` also answers).
    pub(crate) fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one live `pollfd`, count 1.
        let rc = unsafe { libc::poll(&raw mut p, 1, ms) };
        match rc {
            -1 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    Ok(false)
                } else {
                    Err(e)
                }
            }
            0 => Ok(false),
            _ => Ok(p.revents & libc::POLLIN != 0),
        }
    }
}

/// The descriptor, for mio on a kernel umad device (not under `umad2sim`).
impl AsRawFd for Umad {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl Drop for Umad {
    fn drop(&mut self) {
        if self.agent != u32::MAX {
            let mut id = self.agent;
            // SAFETY: `id` is a live u32 the ioctl reads.
            unsafe { libc::ioctl(self.fd, IB_USER_MAD_UNREGISTER_AGENT as _, &raw mut id) };
        }
        // SAFETY: `fd` is ours and closed once, here.
        unsafe { libc::close(self.fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_header() {
        assert_eq!(size_of::<RegReq>(), 28);
        assert_eq!(IB_USER_MAD_REGISTER_AGENT, 0xC01C_1B01);
        assert_eq!(IB_USER_MAD_UNREGISTER_AGENT, 0x4004_1B02);
    }

    #[test]
    fn a_kernel_ipoib_netdev_of_the_port_and_partition_is_found() {
        let root = std::env::temp_dir().join(format!("umad-net-{}", std::process::id()));
        let ib0 = root.join("ib0");
        std::fs::create_dir_all(ib0.join("device/infiniband/mlx5_0")).unwrap();
        for (f, v) in [("type", "32\n"), ("dev_port", "0\n"), ("pkey", "0xffff\n")] {
            std::fs::write(ib0.join(f), v).unwrap();
        }
        let eth = root.join("eth0");
        std::fs::create_dir_all(&eth).unwrap();
        std::fs::write(eth.join("type"), "1\n").unwrap();
        let r = root.to_str().unwrap();
        assert!(kernel_ipoib_on(r, "mlx5_0", 1, 0xffff));
        assert!(kernel_ipoib_on(r, "mlx5_0", 1, 0x7fff));
        assert!(!kernel_ipoib_on(r, "mlx5_0", 2, 0xffff));
        assert!(!kernel_ipoib_on(r, "mlx5_1", 1, 0xffff));
        assert!(!kernel_ipoib_on(r, "mlx5_0", 1, 0x8001));
        assert!(!kernel_ipoib_on("/nonexistent", "mlx5_0", 1, 0xffff));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn sysfs_numbers() {
        assert_eq!(parse_num("0x4"), Some(4));
        assert_eq!(parse_num("4: ACTIVE"), Some(4));
        assert_eq!(parse_num("12"), Some(12));
        assert_eq!(parse_num("x"), None);
    }
}
