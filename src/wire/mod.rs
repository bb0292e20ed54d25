//! Packet codecs: RoCEv2 (the Base Transport Header, the extension headers, the invariant CRC,
//! the GRH area and a whole-datagram view), IB CM MADs and IPoIB.
//!
//! Everything here works on byte slices. There is no I/O, no clock, and the parsers do not
//! allocate. The only allocating function is [`RoceRepr::emit`], which fills a caller-owned
//! `Vec<u8>` (reuse it across packets to avoid reallocating).
//!
//! # Layers
//!
//! - [`ids`]: the identifiers the headers carry ([`QpNum`], [`Psn`] with its 24-bit window
//!   arithmetic, [`Gid`], [`PathMtu`]). `wire` depends on nothing else in the crate; `verbs`
//!   re-exports these.
//! - [`bth`]: the 12-byte Base Transport Header ([`Bth`]) and the [`Opcode`] table.
//! - [`ext`]: the extension headers used by RC and UD: [`Reth`], [`Aeth`] (with its
//!   [`Syndrome`] byte and the RNR timer table), [`Deth`] and [`ImmDt`].
//! - [`icrc`]: the invariant CRC exactly as Linux `rdma_rxe` computes it, over a masked copy of
//!   the IP and UDP headers ([`IpHeaderInfo`]).
//! - [`field`]: byte fields: cutting headers out of buffers and big-endian integers at
//!   offsets, without panics.
//! - [`grh`]: the 40-byte GRH area at the start of every UD receive buffer ([`grh::GrhRepr`]).
//! - [`cm`]: IB Communication Manager MADs (REQ, REP, RTU, DREQ, DREP, REJ, MRA) and the
//!   IPoIB-CM private data and service IDs.
//! - [`cma`]: rdma_cm's `cma_hdr` at the start of a REQ's private data and its port-space
//!   service IDs.
//! - [`ipoib`]: IPoIB encapsulation, the 20-byte hardware address, ARP, IPv6 ND and the
//!   multicast GIDs.
//! - [`sa`]: Subnet Administration MADs: the SA header, PathRecord and MCMemberRecord.
//! - [`worker_id`]: which of an interface's workers a QPN, a comm id or a datagram belongs to
//!   ([`WorkerId`]: the worker's index in the number's low bits).
//! - [`roce`]: the UDP payload of a RoCEv2 datagram (BTH … ICRC) as a borrowed, parsed view
//!   ([`RocePacket`]) and as a builder ([`RoceRepr`]).
//!
//! # Byte order
//!
//! Every multi-byte field is big-endian (network order) **except the ICRC**, which travels
//! little-endian (least significant byte first, like the Ethernet FCS). [`RocePacket::icrc`]
//! holds the value as read with `u32::from_le_bytes`, so it compares equal to
//! [`compute_icrc`]'s result.
//!
//! # Panics
//!
//! Parsing never panics: truncated or malformed input yields a [`WireError`]. The `emit`
//! functions of the fixed-size headers panic if the caller's buffer is shorter than the
//! header's `HEADER_LEN`; that is a programming error, never a property of received bytes.
//!
//! # References
//!
//! Layouts follow IBTA Vol. 1 chapter 9 and Annex A17 (RoCEv2), cross-checked against Linux
//! `drivers/infiniband/sw/rxe/` (`rxe_hdr.h`, `rxe_opcode.c`, `rxe_icrc.c`) and scapy's
//! `contrib/roce.py`.

#![deny(clippy::indexing_slicing, clippy::panic_in_result_fn)]

pub mod bth;
pub mod cm;
pub mod cma;
pub mod ext;
pub mod grh;
pub mod ib;
pub mod icrc;
pub mod ids;
pub mod ipoib;
pub mod lrh;
pub mod roce;
pub mod sa;
pub mod smp;
pub mod worker_id;

// The byte-field helpers every codec above reads and writes through.
pub mod field;

pub use bth::{Bth, Opcode, Transport, PSN_MASK, QPN_MASK};
pub use ext::{
    rnr_timer_code_at_least, rnr_timer_duration, Aeth, Deth, ImmDt, NakCode, Reth, Syndrome,
};
pub use icrc::{append_icrc, compute_icrc, read_icrc, verify_icrc, IpHeaderInfo, ICRC_LEN};
pub use ids::{Gid, IdMap, PathMtu, PeerMap, Psn, QpNum};
pub use lrh::{append_vcrc, read_vcrc, vcrc, verify_vcrc, Lnh, Lrh, LRH_LEN, VCRC_LEN};
pub use roce::{RocePacket, RoceRepr};
pub use worker_id::{BadWorkerCount, Framing, WorkerCount, WorkerId, CONTROL_QPNS};

/// The UDP destination port of RoCEv2 (IANA "roce"). Receivers key on it; the source port is
/// free (Linux picks one per QP in `0xC000..=0xFFFF`).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// The default partition key, full member (`IB_DEFAULT_PKEY_FULL`). RoCE peers send it on
/// every packet.
pub const DEFAULT_PKEY: u16 = 0xFFFF;

/// The well-known Q_Key of the General Services Interface (QP1). `rdma_rxe` drops QP1 packets
/// whose DETH carries any other Q_Key.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// Why a RoCEv2 header or datagram could not be parsed.
///
/// Every parser in [`wire`](self) returns this instead of panicking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends before the header (or the headers the opcode requires, plus the ICRC).
    #[error("truncated packet")]
    Truncated,
    /// The BTH transport header version is not 0. [`Bth::parse`] does not check it; see
    /// [`Bth::check_tver`].
    #[error("unsupported BTH transport version {0}")]
    BadTver(u8),
    /// The opcode is reserved or belongs to a transport this module does not describe (RD,
    /// XRC, vendor-specific).
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The opcode is valid, but its extension headers (AtomicETH, AtomicAckETH, IETH, FETH)
    /// have no representation in [`RocePacket`]/[`RoceRepr`].
    #[error("unsupported opcode {0:#04x}")]
    UnsupportedOpcode(u8),
    /// The BTH pad count exceeds the bytes between the headers and the ICRC.
    #[error("pad count exceeds the payload")]
    BadPad,
    /// The packet has a payload although its opcode carries none (ACK, RDMA READ request,
    /// CNP).
    #[error("payload present on an opcode that carries none")]
    BadLength,
    /// The AETH syndrome byte has the reserved bit 7 set or the reserved type `0b10`.
    #[error("invalid AETH syndrome {0:#04x}")]
    BadSyndrome(u8),
    /// The ICRC does not match the packet.
    #[error("ICRC mismatch")]
    BadIcrc,
    /// The extension headers of a [`RoceRepr`] do not match its opcode.
    #[error("extension headers do not match opcode {0:#04x}")]
    HeaderMismatch(u8),
}

/// Result of the wire parsers.
pub type Result<T> = core::result::Result<T, WireError>;
