//! rdma_cm's framing of CM private data: the `cma_hdr` at the start of a REQ's private data and
//! the port-space service IDs (Linux `drivers/infiniband/core/cma.c`, `cma_format_hdr`,
//! `cma_save_ip_info`, `cma_get_service_id`).
//!
//! ```text
//!  0         1         2        4                    20                   36
//! +---------+---------+--------+--------------------+--------------------+-----------
//! | version | IP ver  |  port  |  source address    | destination addr.  | user data
//! |  0x00   | 7:4     |  BE16  |  cma_ip_addr       | cma_ip_addr        | (<= 56 B)
//! +---------+---------+--------+--------------------+--------------------+-----------
//! ```
//!
//! `union cma_ip_addr` is 16 bytes: an IPv6 address, or an IPv4 address in the last four bytes
//! after twelve zero bytes (**not** `::ffff:a.b.c.d`). The port is the active side's (source)
//! port; the destination port travels in the service ID. Only a REQ carries the header; REP,
//! RTU, DREQ and DREP private data is the user's alone.
//!
//! The passive kernel accepts a REQ when the version is 0, the IP version nibble is 4 or 6, and
//! (for a listener bound to an address) the nibble and destination match the listener
//! (`cma_match_private_data`; the twelve pad bytes of an IPv4 address are not looked at). A REQ
//! it refuses, for that or any other reason of rdma_cm's, draws REJ ConsumerDefined (28) with
//! neither ARI nor private data ([`KERNEL_REFUSAL`]): the REQ handler fails and `ib_cm`'s
//! `cm_destroy_id` rejects the REQ it had received.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::cm::RejReason;
use super::field::{emit_head, head, Bytes};

/// Size of `struct cma_hdr`.
pub const CMA_HDR_LEN: usize = 36;

/// `CMA_VERSION`: the only header version rdma_cm writes or accepts.
pub const CMA_VERSION: u8 = 0;

/// The most user data a REQ carries after the header: the REQ's 92 bytes of private data less
/// the header (`IB_CM_REQ_PRIVATE_DATA_SIZE - sizeof(struct cma_hdr)`).
pub const CMA_REQ_USER_DATA_MAX: usize = 92 - CMA_HDR_LEN;

/// The REJ reason the kernel's rdma_cm answers a REQ with when it refuses the header (or finds
/// no listener behind a matching service ID): ConsumerDefined, no ARI, no private data.
pub const KERNEL_REFUSAL: RejReason = RejReason::ConsumerDefined;

/// The first port of Linux's default `ip_local_port_range` (32768–60999), where rdma_cm
/// picks the active side's port.
pub const EPHEMERAL_PORT_FIRST: u16 = 32768;

/// How many ports that range holds.
pub const EPHEMERAL_PORT_COUNT: u16 = 28232;

/// A port of the ephemeral range chosen by `random`: the source port an active side puts in
/// its header, as rdma_cm's `cma_alloc_any_port` would pick one (the passive side only
/// records it).
#[must_use]
pub const fn ephemeral_port(random: u64) -> u16 {
    EPHEMERAL_PORT_FIRST + (random % EPHEMERAL_PORT_COUNT as u64) as u16
}

/// Byte offsets in the header.
mod offset {
    /// The version byte.
    pub(super) const VERSION: usize = 0;
    /// The IP version, in the high nibble.
    pub(super) const IP_VERSION: usize = 1;
    /// The active side's port, 2 bytes.
    pub(super) const PORT: usize = 2;
    /// The source address, 16 bytes.
    pub(super) const SRC: usize = 4;
    /// The destination address, 16 bytes.
    pub(super) const DST: usize = 20;
}

/// rdma_cm's port spaces (`enum rdma_ucm_port_space`), each the middle 16 bits of its service
/// IDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_TCP` (0x0106): RC, what `rdma_server`, `ucmatose` and `rping` use.
    Tcp,
    /// `RDMA_PS_UDP` (0x0111): UD through SIDR.
    Udp,
    /// `RDMA_PS_IB` (0x013F): any QP type.
    Ib,
}

impl PortSpace {
    /// The port space's number (`RDMA_PS_*`).
    #[must_use]
    pub const fn code(self) -> u16 {
        match self {
            Self::Tcp => 0x0106,
            Self::Udp => 0x0111,
            Self::Ib => 0x013F,
        }
    }

    /// The port space numbered `code`, if rdma_cm has one of that number here.
    #[must_use]
    pub const fn from_code(code: u16) -> Option<Self> {
        match code {
            0x0106 => Some(Self::Tcp),
            0x0111 => Some(Self::Udp),
            0x013F => Some(Self::Ib),
            _ => None,
        }
    }

    /// The service ID of `port` in this space: `0x0000_0000_PPPP_0000 | port`
    /// (`cma_get_service_id`).
    #[must_use]
    pub const fn service_id(self, port: u16) -> u64 {
        ((self.code() as u64) << 16) | port as u64
    }

    /// The port space and port of an rdma_cm service ID; `None` if the top 32 bits are not zero
    /// or the space is not one of [`PortSpace`]'s.
    #[must_use]
    pub const fn parse_service_id(service_id: u64) -> Option<(Self, u16)> {
        if service_id >> 32 != 0 {
            return None;
        }
        match Self::from_code((service_id >> 16) as u16) {
            Some(ps) => Some((ps, service_id as u16)),
            None => None,
        }
    }
}

/// Why private data does not hold a `cma_hdr` rdma_cm would accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum CmaError {
    /// Fewer than [`CMA_HDR_LEN`] bytes.
    #[error("private data shorter than the 36-byte cma_hdr")]
    Truncated,
    /// The version byte is not [`CMA_VERSION`].
    #[error("cma_hdr version {0} (rdma_cm speaks 0)")]
    BadVersion(u8),
    /// The IP version nibble is neither 4 nor 6.
    #[error("cma_hdr IP version {0} (neither 4 nor 6)")]
    BadIpVersion(u8),
    /// The emit buffer is too short, or the two addresses are of different families.
    #[error("cma_hdr source and destination of different IP versions")]
    MixedFamilies,
    /// The destination is not the listener's address (or not of its family).
    #[error("cma_hdr names {dst}, not {listener}")]
    OtherDestination {
        /// The header's destination.
        dst: IpAddr,
        /// The listener's address.
        listener: IpAddr,
    },
}

/// A `struct cma_hdr`: the addresses and port of an rdma_cm REQ.
///
/// Both addresses are of one family, the one the IP version nibble names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHdr {
    /// The active side's port (bytes 2–3).
    pub src_port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The address the active side connects to: the passive side's.
    pub dst: IpAddr,
}

impl CmaHdr {
    /// Decodes the header at the start of `private_data` and returns it with the user data
    /// after it (every byte from 36 on; a received REQ's zero padding included).
    ///
    /// # Errors
    ///
    /// [`CmaError::Truncated`], [`CmaError::BadVersion`] or [`CmaError::BadIpVersion`], the
    /// checks rdma_cm makes before it looks for a listener.
    pub fn parse(private_data: &[u8]) -> Result<(Self, &[u8]), CmaError> {
        let b = head::<CMA_HDR_LEN>(private_data).ok_or(CmaError::Truncated)?;
        let user = private_data.get(CMA_HDR_LEN..).unwrap_or_default();
        Ok((Self::from_bytes(b)?, user))
    }

    /// What rdma_cm does with a REQ's private data for a listener bound to `listener`: the
    /// header parses ([`parse`](Self::parse)) and names the listener
    /// ([`matches_listener`](Self::matches_listener)). On success the header and the user
    /// data after it; on failure the REQ gets the REJ [`KERNEL_REFUSAL`].
    ///
    /// # Errors
    ///
    /// Those of [`parse`](Self::parse), and [`CmaError::OtherDestination`].
    pub fn accept_req(private_data: &[u8], listener: IpAddr) -> Result<(Self, &[u8]), CmaError> {
        let (hdr, user) = Self::parse(private_data)?;
        if !hdr.matches_listener(listener) {
            return Err(CmaError::OtherDestination {
                dst: hdr.dst,
                listener,
            });
        }
        Ok((hdr, user))
    }

    /// Decodes exactly [`CMA_HDR_LEN`] bytes (see [`parse`](Self::parse)).
    ///
    /// # Errors
    ///
    /// [`CmaError::BadVersion`] or [`CmaError::BadIpVersion`].
    pub fn from_bytes(b: &[u8; CMA_HDR_LEN]) -> Result<Self, CmaError> {
        use offset::*;
        let version = b.bytes::<VERSION, 1>()[0];
        if version != CMA_VERSION {
            return Err(CmaError::BadVersion(version));
        }
        let ip_version = b.bytes::<IP_VERSION, 1>()[0] >> 4;
        let (src, dst) = match ip_version {
            4 => (
                IpAddr::V4(Ipv4Addr::from(b.bytes::<{ SRC + 12 }, 4>())),
                IpAddr::V4(Ipv4Addr::from(b.bytes::<{ DST + 12 }, 4>())),
            ),
            6 => (
                IpAddr::V6(Ipv6Addr::from(b.bytes::<SRC, 16>())),
                IpAddr::V6(Ipv6Addr::from(b.bytes::<DST, 16>())),
            ),
            v => return Err(CmaError::BadIpVersion(v)),
        };
        Ok(Self {
            src_port: b.be16::<PORT>(),
            src,
            dst,
        })
    }

    /// The IP version nibble's value: 4 or 6.
    #[must_use]
    pub const fn ip_version(&self) -> u8 {
        match self.dst {
            IpAddr::V4(_) => 4,
            IpAddr::V6(_) => 6,
        }
    }

    /// Encodes the header as `cma_format_hdr` does.
    ///
    /// # Errors
    ///
    /// [`CmaError::MixedFamilies`] if `src` and `dst` are of different families.
    pub fn to_bytes(&self) -> Result<[u8; CMA_HDR_LEN], CmaError> {
        use offset::*;
        let mut b = [0u8; CMA_HDR_LEN];
        b.put_bytes::<VERSION, 1>([CMA_VERSION]);
        b.put_bytes::<IP_VERSION, 1>([self.ip_version() << 4]);
        b.put_be16::<PORT>(self.src_port);
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                b.put_bytes::<{ SRC + 12 }, 4>(s.octets());
                b.put_bytes::<{ DST + 12 }, 4>(d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                b.put_bytes::<SRC, 16>(s.octets());
                b.put_bytes::<DST, 16>(d.octets());
            }
            _ => return Err(CmaError::MixedFamilies),
        }
        Ok(b)
    }

    /// A REQ's private data: this header, then `user` (at most [`CMA_REQ_USER_DATA_MAX`]
    /// bytes; longer user data is cut there).
    ///
    /// # Errors
    ///
    /// [`CmaError::MixedFamilies`] as [`to_bytes`](Self::to_bytes).
    pub fn req_private_data(&self, user: &[u8]) -> Result<Vec<u8>, CmaError> {
        let user = user.get(..CMA_REQ_USER_DATA_MAX).unwrap_or(user);
        let mut out = vec![0u8; CMA_HDR_LEN + user.len()];
        emit_head(&mut out, &self.to_bytes()?);
        if let Some(tail) = out.get_mut(CMA_HDR_LEN..) {
            tail.copy_from_slice(user);
        }
        Ok(out)
    }

    /// Whether a listener bound to `listener` would take this header
    /// (`cma_match_private_data`): a listener bound to an address takes a header of its family
    /// naming that address; `0.0.0.0` takes any IPv4 header (rdma_cm binds AF_INET "afonly");
    /// `::` takes any header (Linux's default `bindv6only` of 0).
    #[must_use]
    pub fn matches_listener(&self, listener: IpAddr) -> bool {
        match (listener, self.dst) {
            (IpAddr::V6(l), _) if l.is_unspecified() => true,
            (IpAddr::V4(l), IpAddr::V4(d)) => l.is_unspecified() || l == d,
            (IpAddr::V6(l), IpAddr::V6(d)) => l == d,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests;
