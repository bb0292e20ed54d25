//! CM MADs on the kernel's real QP1 through `/dev/infiniband/umadN`, for kernel verbs on a host
//! whose kernel runs no CM (`ib_cm` not loaded).
//!
//! The transport registers a umad agent as a *server* of the CM class (0x07, version 2,
//! method Send, the one method every CM message uses), so the kernel's MAD layer hands it every
//! REQ, MRA, REJ, REP, RTU, DREQ, DREP, LAP, APR and SIDR MAD that arrives on the port's QP1,
//! and it sends ours from QP1 to QP1 of the peer with Q_Key `0x80010000` and the P_Key index
//! of the endpoint's partition. What the CM state machine sees is byte for byte what it sees
//! over [`super::Gsi`] on the software provider.
//!
//! Only one agent per port may serve a (class, method) pair: while `ib_cm` is loaded the
//! registration fails, and [`UmadError::ClassTaken`] says so in one line.
//!
//! Addressing:
//! - **RoCE** (the port's link layer is Ethernet): every MAD carries a GRH. A send names the
//!   peer's GID, our GID index (the one the verbs provider uses), a hop limit of 64 and
//!   traffic class 0, as [`AddressVector::to_gid`](crate::verbs::AddressVector::to_gid) does;
//!   the kernel resolves the peer's MAC from the GID. A received MAD's sender is the GRH's
//!   source GID (`ib_umad`'s `recv_handler` copies it into the header).
//! - **InfiniBand** (unverified: no HCA here): subnet-local CM MADs carry no GRH, only LIDs.
//!   The LID of each peer comes from [`Umad::set_peer_lid`], which the driver calls with the
//!   DLID of every PathRecord the SA client resolves for a neighbour, and a received MAD without a GRH is attributed to the GID whose LID
//!   it came from. A send to a GID whose LID is unknown, and a GRH-less MAD from an unknown
//!   LID, are dropped and counted (`errors`, `recv_malformed`).
//!
//! The umad descriptor is a kernel descriptor that epoll accepts: the driver registers it with
//! mio ([`MadTransport::readiness_fd`](super::MadTransport::readiness_fd)) and each turn reads at
//! most [`UMAD_BATCH`] MADs; more left queued asks for the next turn at once
//! ([`MadTransport::has_more`](super::MadTransport::has_more)).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, RawFd};

use super::{count_send, MadStats, MAD_LEN};
use crate::sys::umad::{self as sys, AgentSpec, UmadAddr, UmadGrh, UmadOpenError, UmadRecv};
use crate::verbs::{Gid, QKey, QpNum};

/// The CM management class.
pub const CM_MGMT_CLASS: u8 = 0x07;
/// The CM class version.
pub const CM_CLASS_VERSION: u8 = 2;
/// The MAD method of every CM message (Send).
pub const CM_METHOD_SEND: u8 = 0x03;
/// MADs read from the umad device per turn.
pub const UMAD_BATCH: usize = 256;
/// Peers whose LID [`Umad::set_peer_lid`] keeps (InfiniBand).
pub const PEER_LID_CAP: usize = 4096;
/// The hop limit of every GRH we send (RoCEv2's IPv4 TTL), as the verbs provider's AVs use.
pub const UMAD_HOP_LIMIT: u8 = 64;

/// Where the umad transport runs and how it addresses its MADs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UmadConfig {
    /// The verbs device (`rxe0`, `mlx5_0`): the umad device is the one of this device and
    /// port.
    pub device: String,
    /// The port number.
    pub port: u8,
    /// Our GID's index in the port's GID table (the verbs provider's).
    pub gid_index: u8,
    /// The P_Key index of the endpoint's partition.
    pub pkey_index: u16,
    /// The service level of every MAD (InfiniBand; unverified).
    pub sl: u8,
}

/// Why the umad transport could not be opened. Each `Display` is one line.
#[derive(Debug, thiserror::Error)]
pub enum UmadError {
    /// No `/sys/class/infiniband_mad/umadN` for the device and port, or its sysfs is unreadable.
    #[error("{0}")]
    NoDevice(#[source] io::Error),
    /// The port's link layer could not be read.
    #[error("{device} port {port} link layer: {source}")]
    LinkLayer {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `/dev/infiniband/umadN` did not open (permissions, or `ib_umad` not loaded).
    #[error("/dev/infiniband/umad{umad}: {source}")]
    Open {
        /// The umad index.
        umad: u32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Another agent serves the CM class on this port: the kernel's CM (`ib_cm`) is loaded.
    #[error(
        "umad{umad} ({device} port {port}): CM class 0x07 is already served on this port, the kernel's CM (ib_cm) is loaded: use --cm-transport udp, or unload it (modprobe -r rdma_ucm rdma_cm ib_cm)"
    )]
    ClassTaken {
        /// The umad index.
        umad: u32,
        /// The device.
        device: String,
        /// The port.
        port: u8,
    },
    /// The agent could not be registered for another reason.
    #[error("umad{umad}: {step}: {source}")]
    Register {
        /// The umad index.
        umad: u32,
        /// The step that failed.
        step: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Our CM's MADs on the kernel's QP1 through one umad agent.
#[derive(Debug)]
pub struct Umad {
    dev: sys::Umad,
    umad: u32,
    cfg: UmadConfig,
    /// The port is RoCE: every MAD carries a GRH, no LIDs.
    roce: bool,
    /// InfiniBand: the LID of each peer we may send to, and back.
    lids: HashMap<Gid, u16>,
    gids: HashMap<u16, Gid>,
    stats: MadStats,
    /// The last poll stopped at [`UMAD_BATCH`].
    more: bool,
    /// A read failed with `EIO` or `ENODEV`: the kernel killed the port's agents (the device
    /// is being removed), and nothing will be read or sent through it again.
    gone: bool,
}

impl Umad {
    /// Finds the umad device of `cfg`'s device and port, opens it and registers the CM agent.
    ///
    /// # Errors
    /// [`UmadError::ClassTaken`] while `ib_cm` is loaded; the failing step otherwise.
    pub fn open(cfg: UmadConfig) -> Result<Self, UmadError> {
        let (umad, _, _) =
            sys::find_umad(Some(&cfg.device), Some(cfg.port)).map_err(UmadError::NoDevice)?;
        let roce = sys::link_layer_is_ethernet(&cfg.device, cfg.port).map_err(|source| {
            UmadError::LinkLayer {
                device: cfg.device.clone(),
                port: cfg.port,
                source,
            }
        })?;
        let spec = AgentSpec::server(CM_MGMT_CLASS, CM_CLASS_VERSION, &[CM_METHOD_SEND]);
        let dev = sys::Umad::open_agent(umad, &spec)
            .map_err(|e| open_error(umad, &cfg.device, cfg.port, e))?;
        Ok(Self {
            dev,
            umad,
            cfg,
            roce,
            lids: HashMap::new(),
            gids: HashMap::new(),
            stats: MadStats::default(),
            more: false,
            gone: false,
        })
    }

    /// The `umadN` index in use.
    #[must_use]
    pub fn umad_index(&self) -> u32 {
        self.umad
    }

    /// True on a RoCE port (GRH addressing), false on InfiniBand (LID addressing).
    #[must_use]
    pub fn is_roce(&self) -> bool {
        self.roce
    }

    /// InfiniBand: `gid` is reached at `lid` (from its PathRecord). Unverified without an
    /// HCA. At most [`PEER_LID_CAP`] peers are kept; beyond it a new peer is refused (false).
    pub fn set_peer_lid(&mut self, gid: Gid, lid: u16) -> bool {
        if !self.lids.contains_key(&gid) && self.lids.len() >= PEER_LID_CAP {
            return false;
        }
        if let Some(old) = self.lids.insert(gid, lid) {
            self.gids.remove(&old);
        }
        self.gids.insert(lid, gid);
        true
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> MadStats {
        self.stats
    }

    /// Where a MAD to `to` goes ([`cm_address`]); `None` on InfiniBand while its LID is
    /// unknown.
    fn address(&self, to: Gid) -> Option<UmadAddr> {
        let lid = if self.roce {
            None
        } else {
            Some(*self.lids.get(&to)?)
        };
        Some(cm_address(&self.cfg, to, lid))
    }

    /// The sender of a received MAD ([`cm_sender`]).
    fn sender(&self, from: &UmadAddr) -> Option<Gid> {
        cm_sender(from, |lid| self.gids.get(&lid).copied())
    }

    /// Sends one MAD to QP1 of `to`. A write the kernel refuses for lack of room (`EAGAIN`,
    /// `ENOMEM`) is dropped and counted: the CM retransmits.
    ///
    /// # Errors
    /// Any other write error.
    pub fn send(&mut self, to: Gid, mad: &[u8; MAD_LEN]) -> io::Result<()> {
        let Some(addr) = self.address(to) else {
            self.stats.errors += 1;
            return Ok(());
        };
        let r = self.dev.send(mad, &addr, 0);
        count_send(&mut self.stats, r, |e| {
            e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOMEM)
        })
    }

    /// The umad descriptor (a kernel one, which epoll accepts), for the event loop.
    pub fn readiness_fd(&self) -> RawFd {
        self.dev.as_raw_fd()
    }

    /// True when the last [`Umad::poll`] stopped at [`UMAD_BATCH`] with MADs left.
    pub fn has_more(&self) -> bool {
        self.more
    }

    /// True once a read said the port's agents are dead (`EIO`, `ENODEV`: the device is
    /// being removed).
    pub fn device_gone(&self) -> bool {
        self.gone
    }

    /// Reads up to [`UMAD_BATCH`] queued MADs, appending each with its sender to `out`.
    pub fn poll(&mut self, out: &mut Vec<(Gid, [u8; MAD_LEN])>) {
        self.more = false;
        let mut mad = [0u8; MAD_LEN];
        for i in 0..UMAD_BATCH {
            match self.dev.recv(&mut mad) {
                Ok(None) => return,
                Ok(Some(UmadRecv::Mad(from))) => match self.sender(&from) {
                    Some(gid) => {
                        self.stats.received += 1;
                        out.push((gid, mad));
                    }
                    None => self.stats.recv_malformed += 1,
                },
                Ok(Some(UmadRecv::SendFailed(errno))) => {
                    self.stats.errors += 1;
                    tracing::warn!(
                        error = %io::Error::from_raw_os_error(errno as i32),
                        "the kernel reports a CM MAD of ours failed to go out (the CM retransmits)"
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    self.stats.recv_malformed += 1;
                }
                Err(e) => {
                    self.stats.errors += 1;
                    if matches!(e.raw_os_error(), Some(libc::EIO | libc::ENODEV)) {
                        self.gone = true;
                    }
                    return;
                }
            }
            if i + 1 == UMAD_BATCH {
                self.more = true;
            }
        }
    }
}

/// Where a CM MAD to `to` goes: QP1, the GSI Q_Key, our partition's P_Key index, and either
/// a GRH from our GID index to `to` (RoCE: `lid` is `None`) or `to`'s LID without a GRH
/// (InfiniBand, subnet-local; unverified).
fn cm_address(cfg: &UmadConfig, to: Gid, lid: Option<u16>) -> UmadAddr {
    let grh = lid.is_none().then_some(UmadGrh {
        gid_index: cfg.gid_index,
        hop_limit: UMAD_HOP_LIMIT,
        traffic_class: 0,
        gid: to.0,
        flow_label: 0,
    });
    UmadAddr {
        qpn: QpNum::GSI.get(),
        qkey: QKey::GSI.0,
        lid: lid.unwrap_or(0),
        sl: cfg.sl,
        path_bits: 0,
        grh,
        pkey_index: cfg.pkey_index,
    }
}

/// The sender of a received MAD: the GRH's source GID, else (InfiniBand) the GID that
/// `gid_of_lid` knows for the source LID.
fn cm_sender(from: &UmadAddr, gid_of_lid: impl Fn(u16) -> Option<Gid>) -> Option<Gid> {
    match &from.grh {
        Some(g) => Some(Gid(g.gid)),
        None => gid_of_lid(from.lid),
    }
}

/// Maps a failed open to the transport's error: a server registration refused with `EINVAL`
/// or `EBUSY` means another agent (`ib_cm`) holds the class's Send method on the port.
fn open_error(umad: u32, device: &str, port: u8, e: UmadOpenError) -> UmadError {
    match e {
        UmadOpenError::Open(source) => UmadError::Open { umad, source },
        UmadOpenError::Register(source)
            if matches!(source.raw_os_error(), Some(libc::EINVAL | libc::EBUSY)) =>
        {
            UmadError::ClassTaken {
                umad,
                device: device.to_owned(),
                port,
            }
        }
        UmadOpenError::Register(source) => UmadError::Register {
            umad,
            step: "registering a CM agent",
            source,
        },
        UmadOpenError::EnablePkey(source) => UmadError::Register {
            umad,
            step: "enabling P_Key indices",
            source,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_taken_is_one_line_naming_the_way_out() {
        let e = open_error(
            0,
            "rxe0",
            1,
            UmadOpenError::Register(io::Error::from_raw_os_error(libc::EINVAL)),
        );
        let line = e.to_string();
        assert!(matches!(e, UmadError::ClassTaken { .. }), "{e:?}");
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("umad0 (rxe0 port 1)"), "{line}");
        assert!(line.contains("ib_cm"), "{line}");
        assert!(line.contains("--cm-transport udp"), "{line}");
        let other = open_error(
            0,
            "rxe0",
            1,
            UmadOpenError::Register(io::Error::from_raw_os_error(libc::EPERM)),
        );
        assert!(matches!(other, UmadError::Register { .. }), "{other:?}");
        assert!(!other.to_string().contains('\n'));
    }

    fn cfg() -> UmadConfig {
        UmadConfig {
            device: "rxe0".into(),
            port: 1,
            gid_index: 3,
            pkey_index: 2,
            sl: 0,
        }
    }

    /// The header of a CM MAD sent to `addr`.
    fn header(addr: UmadAddr) -> [u8; sys::UMAD_HDR_PKEY_LEN] {
        sys::UmadHdr {
            agent: 7,
            status: 0,
            timeout_ms: 0,
            retries: 0,
            length: MAD_LEN as u32,
            addr,
        }
        .encode()
    }

    #[test]
    fn a_roce_cm_mad_goes_to_qp1_of_the_peer_gid_with_a_grh() {
        let peer = Gid::from_ip("192.168.77.1".parse().unwrap());
        let h = header(cm_address(&cfg(), peer, None));
        assert_eq!(&h[20..24], &[0, 0, 0, 1], "remote QPN 1, big-endian");
        assert_eq!(
            &h[24..28],
            &[0x80, 0x01, 0x00, 0x00],
            "GSI Q_Key, big-endian"
        );
        assert_eq!(&h[28..30], &[0, 0], "no LID on RoCE");
        assert_eq!(h[32], 1, "grh_present");
        assert_eq!(h[33], 3, "our GID index");
        assert_eq!(h[34], UMAD_HOP_LIMIT);
        assert_eq!(h[35], 0, "traffic class");
        assert_eq!(&h[36..52], &peer.0, "the peer's GID");
        assert_eq!(&h[52..56], &[0; 4], "flow label");
        assert_eq!(u16::from_ne_bytes([h[56], h[57]]), 2, "P_Key index");
        assert_eq!(&h[58..64], &[0; 6]);
        // What the kernel hands back for a MAD from that peer names it as the sender.
        let back = sys::UmadHdr::decode(&h, sys::HdrAbi::WithPkey).unwrap();
        assert_eq!(cm_sender(&back.addr, |_| None), Some(peer));
        assert_eq!(back.addr.pkey_index, 2);
    }

    #[test]
    fn an_ib_cm_mad_goes_to_the_peer_lid_without_a_grh() {
        let peer = Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 2, 0xc9, 3, 0, 1, 2, 3]);
        let a = cm_address(&cfg(), peer, Some(0x12));
        let h = header(a);
        assert_eq!(&h[28..30], &[0, 0x12], "DLID, big-endian");
        assert_eq!(h[32], 0, "no GRH");
        let back = sys::UmadHdr::decode(&h, sys::HdrAbi::WithPkey).unwrap();
        assert_eq!(
            cm_sender(&back.addr, |l| (l == 0x12).then_some(peer)),
            Some(peer)
        );
        assert_eq!(
            cm_sender(&back.addr, |_| None),
            None,
            "an unknown LID names no sender"
        );
    }

    #[test]
    fn the_cm_agent_serves_method_send_with_pkey_indices() {
        let spec = AgentSpec::server(CM_MGMT_CLASS, CM_CLASS_VERSION, &[CM_METHOD_SEND]);
        assert_eq!(spec.method_mask, [1 << 3, 0, 0, 0]);
        assert_eq!(spec.abi, sys::HdrAbi::WithPkey);
        assert_eq!((spec.mgmt_class, spec.class_version), (0x07, 2));
    }
}
