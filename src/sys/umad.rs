//! `/dev/infiniband/umadN`: a MAD agent registered for Subnet Administration responses only,
//! sending and receiving non-blocking, plus the port attributes sysfs gives.
//!
//! Every call goes through libc's `open`, `read`, `write`, `ioctl`, `poll` and `close` (never
//! Rust's `std::fs`, which opens with `open64`), so ibsim's `umad2sim` preload, which wraps
//! exactly those symbols, carries them to a simulated fabric unchanged. Two things differ
//! there, and both are handled here: its descriptors (1024 and up) are no kernel descriptors
//! (they work with `poll(2)`, which it wraps, but not with epoll; [`Umad::wait_readable`] is
//! the way to wait on them), and its `read` of an empty queue returns `-EWOULDBLOCK` itself
//! instead of `-1` with `errno`.
//!
//! The agent names one class (the SA's, 0x03 version 2) with an empty method mask: the kernel (and
//! `umad2sim`) deliver only responses to its own requests, matched by the high 32 bits of
//! the transaction ID, which they overwrite with the agent's; this coexists with the
//! kernel's `ib_sa`, as `saquery` does.

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

/// How long the kernel waits for the response of one send before it reports the send
/// timed out (the client's own retransmission runs on top).
const SEND_TIMEOUT_MS: u32 = 1000;

/// What [`Umad::recv`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UmadRecv {
    /// A MAD (a response to one of our requests), in the caller's buffer.
    Mad,
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

impl UmadPort {
    /// The first umad port (of `ca`, and `port` if given), `umad0` to `umad31`.
    pub(crate) fn find(ca: Option<&str>, port: Option<u8>) -> io::Result<Self> {
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
            return Self::read(umad, dev, p);
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no InfiniBand umad port (/sys/class/infiniband_mad/umad*)",
        ))
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

/// An open umad device with one SA agent registered.
#[derive(Debug)]
pub(crate) struct Umad {
    fd: RawFd,
    agent: u32,
}

impl Umad {
    /// Opens `/dev/infiniband/umad<N>` non-blocking and registers an agent on QP1 for the
    /// responses of management class `mgmt_class`, version `class_version` (the SA: 0x03,
    /// 2), with the 56-byte header of [`UMAD_HDR_LEN`].
    pub(crate) fn open(umad: u32, mgmt_class: u8, class_version: u8) -> io::Result<Self> {
        let path = CString::new(format!("/dev/infiniband/umad{umad}"))
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `path` is NUL-terminated and outlives the call.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // From here on `Drop` closes `fd` (agent u32::MAX: none registered yet).
        let mut me = Self {
            fd,
            agent: u32::MAX,
        };
        let mut req = RegReq {
            qpn: 1,
            mgmt_class,
            mgmt_class_version: class_version,
            ..RegReq::default()
        };
        // SAFETY: `req` is a live, writable `ib_user_mad_reg_req` the kernel fills in.
        let rc = unsafe { libc::ioctl(fd, IB_USER_MAD_REGISTER_AGENT as _, &raw mut req) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        me.agent = req.id;
        Ok(me)
    }

    /// Sends `mad` to QP1 of `dlid` on `sl` with `qkey` (QP1's is `0x8001_0000`), P_Key
    /// index 0. The kernel
    /// keeps the send for [`SEND_TIMEOUT_MS`] to match the response to it (a response to a
    /// send it no longer holds is dropped).
    pub(crate) fn send(&self, mad: &[u8; MAD_LEN], dlid: u16, sl: u8, qkey: u32) -> io::Result<()> {
        let mut b = [0u8; UMAD_HDR_LEN + MAD_LEN];
        let (hdr, body) = b.split_at_mut(UMAD_HDR_LEN);
        hdr[0..4].copy_from_slice(&self.agent.to_ne_bytes());
        hdr[8..12].copy_from_slice(&SEND_TIMEOUT_MS.to_ne_bytes());
        hdr[16..20].copy_from_slice(&(MAD_LEN as u32).to_ne_bytes());
        hdr[20..24].copy_from_slice(&1u32.to_be_bytes());
        hdr[24..28].copy_from_slice(&qkey.to_be_bytes());
        hdr[28..30].copy_from_slice(&dlid.to_be_bytes());
        hdr[30] = sl;
        body.copy_from_slice(mad);
        // SAFETY: `b` is readable for its whole length; `fd` is open.
        let n = unsafe { libc::write(self.fd, b.as_ptr().cast(), b.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// One MAD into `mad` if one is queued; `Ok(None)` when none is.
    pub(crate) fn recv(&self, mad: &mut [u8; MAD_LEN]) -> io::Result<Option<UmadRecv>> {
        let mut b = [0u8; UMAD_HDR_LEN + MAD_LEN];
        // SAFETY: `b` is writable for its whole length; `fd` is open.
        let n = unsafe { libc::read(self.fd, b.as_mut_ptr().cast(), b.len()) };
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
        let (hdr, body) = b.split_at(UMAD_HDR_LEN);
        let status = hdr
            .get(4..8)
            .and_then(|s| s.try_into().ok())
            .map_or(0, u32::from_ne_bytes);
        if status != 0 {
            return Ok(Some(UmadRecv::SendFailed(status)));
        }
        // The 24-byte common MAD header at least.
        if n < UMAD_HDR_LEN + 24 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "short umad read",
            ));
        }
        *mad = [0u8; MAD_LEN];
        let got = (n - UMAD_HDR_LEN).min(MAD_LEN);
        if let (Some(dst), Some(src)) = (mad.get_mut(..got), body.get(..got)) {
            dst.copy_from_slice(src);
        }
        Ok(Some(UmadRecv::Mad))
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
