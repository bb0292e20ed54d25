//! InfiniBand Communication Manager MADs (IBTA Vol. 1 chapter 12) as they travel over RoCEv2:
//! the 24-byte MAD header ([`MadHeader`]) and the connection messages REQ, MRA, REJ, REP, RTU,
//! DREQ and DREP ([`CmMessage`]), plus the IPoIB-CM conventions layered on top of them
//! ([`ipoib`]).
//!
//! A CM MAD is the 256-byte payload of a UD SEND_ONLY to QP1 (Q_Key
//! [`GSI_QKEY`](super::GSI_QKEY)): a 24-byte MAD header followed by 232 bytes of message.
//! [`CmMad::parse`] decodes one and [`CmMad::emit`] encodes one; neither allocates, and the
//! parser never panics.
//!
//! # Layouts
//!
//! Field offsets and bit positions follow Linux `include/rdma/ibta_vol1_c12.h` (which follows
//! the IBTA tables 106–113). In this module "relative" offsets count from the end of the MAD
//! header, as that header does; the absolute offset in the MAD is 24 more. Every multi-byte
//! field is big-endian. Bit 7 is the most significant bit of a byte.
//!
//! # Field widths
//!
//! Fields narrower than their Rust type (24-bit QPNs and EECNs, 5-bit timeouts, 3-bit retry
//! counts, …) are masked to their width on emit, so a value that does not fit silently loses
//! its high bits. Reserved bits are written as zero and ignored on receive. Hence
//! `parse(emit(m)) == m` holds for every message whose fields fit their widths, and
//! `emit(parse(b)) == b` holds for 256-byte inputs whose reserved bits are zero and whose
//! enumerations hold defined values.
//!
//! # What is not decoded
//!
//! SIDR_REQ, SIDR_REP, LAP, APR (no IPoIB-CM peer sends them) and ClassPortInfo are
//! recognised and refused with [`CmError::UnsupportedAttribute`].

use core::time::Duration;

pub mod ipoib;
mod mra;
mod rej;
mod rep;
mod req;
mod rtu;

#[cfg(test)]
mod tests;

pub use ipoib::{
    ipoib_service_id, parse_ipoib_service_id, IpoibCmData, ServiceIdFlavor,
    IPOIB_CM_SERVICE_ID_LINUX, IPOIB_CM_SERVICE_ID_RFC4755,
};
pub use mra::Mra;
pub use rej::{Rej, RejReason};
pub use rep::Rep;
pub use req::{CmPath, Req};
pub use rtu::{Drep, Dreq, Rtu};

/// Size of every CM MAD: the header plus 232 bytes of message.
pub const MAD_LEN: usize = 256;

/// Size of the common MAD header.
pub const MAD_HEADER_LEN: usize = 24;

/// Size of the message that follows the MAD header (`MAD_LEN - MAD_HEADER_LEN`).
pub const MAD_DATA_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

/// The MAD base version (`IB_MGMT_BASE_VERSION`).
pub const MAD_BASE_VERSION: u8 = 1;

/// Management class of the Communication Manager (`IB_MGMT_CLASS_CM`).
pub const CM_MGMT_CLASS: u8 = 0x07;

/// Class version of the CM MADs Linux sends and accepts (`IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;

/// The Send method (`IB_MGMT_METHOD_SEND`), the only method CM messages use.
pub const METHOD_SEND: u8 = 0x03;

/// Attribute ID of ClassPortInfo, which this module recognises but does not decode.
pub const ATTR_CLASS_PORT_INFO: u16 = 0x0001;

/// Why a CM MAD could not be parsed, or IPoIB-CM private data decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The buffer is shorter than the MAD header, or than the 256-byte MAD (or, for
    /// [`IpoibCmData`], than its 8 bytes).
    #[error("truncated MAD")]
    Truncated,
    /// The MAD base version is not [`MAD_BASE_VERSION`].
    #[error("unsupported MAD base version {0}")]
    BadBaseVersion(u8),
    /// The management class is not [`CM_MGMT_CLASS`].
    #[error("management class {0:#04x} is not CM")]
    NotCm(u8),
    /// The class version is not [`CM_CLASS_VERSION`].
    #[error("unsupported CM class version {0}")]
    BadClassVersion(u8),
    /// The method is not [`METHOD_SEND`].
    #[error("unexpected CM method {0:#04x}")]
    BadMethod(u8),
    /// The attribute ID is not a CM attribute.
    #[error("unknown CM attribute {0:#06x}")]
    UnknownAttribute(u16),
    /// The attribute is a CM attribute this module does not decode (SIDR_REQ, SIDR_REP, LAP,
    /// APR, ClassPortInfo).
    #[error("unsupported CM attribute {0:#06x}")]
    UnsupportedAttribute(u16),
}

/// The common 24-byte MAD header (`struct ib_mad_hdr`).
///
/// | Off | Size | Field |
/// |---|---|---|
/// | 0 | 1 | BaseVersion |
/// | 1 | 1 | MgmtClass |
/// | 2 | 1 | ClassVersion |
/// | 3 | 1 | Method |
/// | 4 | 2 | Status |
/// | 6 | 2 | ClassSpecific |
/// | 8 | 8 | TransactionID |
/// | 16 | 2 | AttributeID |
/// | 18 | 2 | reserved |
/// | 20 | 4 | AttributeModifier |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MadHeader {
    /// Base version; 1 for every MAD Linux sends.
    pub base_version: u8,
    /// Management class; [`CM_MGMT_CLASS`] for the CM.
    pub mgmt_class: u8,
    /// Class version; [`CM_CLASS_VERSION`] for the CM.
    pub class_version: u8,
    /// Method; [`METHOD_SEND`] for the CM.
    pub method: u8,
    /// Status; 0 in CM messages.
    pub status: u16,
    /// Class-specific field; 0 in CM messages.
    pub class_specific: u16,
    /// Transaction ID. REQ and DREQ start a transaction (Linux: `hi_tid << 32 |
    /// local_comm_id`); REP, RTU, MRA, REJ and DREP echo the TID of the message they answer.
    pub transaction_id: u64,
    /// Attribute ID ([`AttrId`] for the CM messages).
    pub attr_id: u16,
    /// Attribute modifier; 0, or ECE data on REQ/REP from newer kernels.
    pub attr_mod: u32,
}

impl MadHeader {
    /// Size of the header on the wire.
    pub const HEADER_LEN: usize = MAD_HEADER_LEN;

    /// A CM header (base version 1, class 7, class version 2, method Send, status 0) for
    /// `attr_id` and `transaction_id`.
    #[must_use]
    pub const fn cm(attr_id: AttrId, transaction_id: u64) -> Self {
        Self {
            base_version: MAD_BASE_VERSION,
            mgmt_class: CM_MGMT_CLASS,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            transaction_id,
            attr_id: attr_id.to_u16(),
            attr_mod: 0,
        }
    }

    /// Decodes the first 24 bytes of `buf`. No field is checked; see [`CmMad::parse`].
    ///
    /// # Errors
    ///
    /// [`CmError::Truncated`] if `buf` is shorter than 24 bytes.
    pub fn parse(buf: &[u8]) -> Result<Self, CmError> {
        buf.first_chunk::<MAD_HEADER_LEN>()
            .map(Self::from_bytes)
            .ok_or(CmError::Truncated)
    }

    /// Decodes a header from exactly 24 bytes. The reserved bytes 18–19 are ignored.
    #[must_use]
    pub const fn from_bytes(b: &[u8; MAD_HEADER_LEN]) -> Self {
        Self {
            base_version: b[0],
            mgmt_class: b[1],
            class_version: b[2],
            method: b[3],
            status: u16::from_be_bytes([b[4], b[5]]),
            class_specific: u16::from_be_bytes([b[6], b[7]]),
            transaction_id: u64::from_be_bytes([
                b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15],
            ]),
            attr_id: u16::from_be_bytes([b[16], b[17]]),
            attr_mod: u32::from_be_bytes([b[20], b[21], b[22], b[23]]),
        }
    }

    /// Encodes the header (reserved bytes zero).
    #[must_use]
    pub const fn to_bytes(&self) -> [u8; MAD_HEADER_LEN] {
        let s = self.status.to_be_bytes();
        let c = self.class_specific.to_be_bytes();
        let t = self.transaction_id.to_be_bytes();
        let a = self.attr_id.to_be_bytes();
        let m = self.attr_mod.to_be_bytes();
        [
            self.base_version,
            self.mgmt_class,
            self.class_version,
            self.method,
            s[0],
            s[1],
            c[0],
            c[1],
            t[0],
            t[1],
            t[2],
            t[3],
            t[4],
            t[5],
            t[6],
            t[7],
            a[0],
            a[1],
            0,
            0,
            m[0],
            m[1],
            m[2],
            m[3],
        ]
    }

    /// Writes the header into the first 24 bytes of `buf`.
    ///
    /// # Panics
    ///
    /// If `buf` is shorter than 24 bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        let len = buf.len();
        match buf.first_chunk_mut::<MAD_HEADER_LEN>() {
            Some(dst) => *dst = self.to_bytes(),
            None => panic!("wire: 24-byte MAD header does not fit a {len}-byte buffer"),
        }
    }
}

/// The CM attribute IDs (`include/rdma/ib_cm.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
pub enum AttrId {
    /// ConnectRequest.
    Req = 0x0010,
    /// Message Receipt Acknowledgement.
    Mra = 0x0011,
    /// ConnectReject.
    Rej = 0x0012,
    /// ConnectReply.
    Rep = 0x0013,
    /// ReadyToUse.
    Rtu = 0x0014,
    /// DisconnectRequest.
    Dreq = 0x0015,
    /// DisconnectReply.
    Drep = 0x0016,
    /// Service ID Resolution request.
    SidrReq = 0x0017,
    /// Service ID Resolution reply.
    SidrRep = 0x0018,
    /// Load Alternate Path.
    Lap = 0x0019,
    /// Alternate Path Response.
    Apr = 0x001A,
}

impl AttrId {
    /// The attribute ID as carried in the MAD header.
    #[must_use]
    pub const fn to_u16(self) -> u16 {
        self as u16
    }

    /// Decodes an attribute ID; `None` for anything that is not a CM attribute (including
    /// ClassPortInfo).
    #[must_use]
    pub const fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x0010 => Self::Req,
            0x0011 => Self::Mra,
            0x0012 => Self::Rej,
            0x0013 => Self::Rep,
            0x0014 => Self::Rtu,
            0x0015 => Self::Dreq,
            0x0016 => Self::Drep,
            0x0017 => Self::SidrReq,
            0x0018 => Self::SidrRep,
            0x0019 => Self::Lap,
            0x001A => Self::Apr,
            _ => return None,
        })
    }
}

impl TryFrom<u16> for AttrId {
    type Error = CmError;

    /// [`AttrId::from_u16`], failing with [`CmError::UnknownAttribute`].
    fn try_from(v: u16) -> Result<Self, CmError> {
        Self::from_u16(v).ok_or(CmError::UnknownAttribute(v))
    }
}

impl From<AttrId> for u16 {
    fn from(a: AttrId) -> Self {
        a.to_u16()
    }
}

/// Which message a REJ or an MRA refers to (the two-bit "Message REJected" / "Message MRAed"
/// field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TargetMsg {
    /// 0: the REQ.
    Req,
    /// 1: the REP.
    Rep,
    /// 2: another message (an MRA may acknowledge a LAP; a REJ of other messages). The
    /// reserved value 3 also decodes as `Other`.
    Other,
}

impl TargetMsg {
    /// Decodes the two-bit field value (`v & 3`).
    #[must_use]
    pub const fn from_bits(v: u8) -> Self {
        match v & 3 {
            0 => Self::Req,
            1 => Self::Rep,
            _ => Self::Other,
        }
    }

    /// The two-bit field value.
    #[must_use]
    pub const fn bits(self) -> u8 {
        match self {
            Self::Req => 0,
            Self::Rep => 1,
            Self::Other => 2,
        }
    }
}

/// A decoded CM message: the 232 bytes after the MAD header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// ConnectRequest (0x0010).
    Req(Req),
    /// Message Receipt Acknowledgement (0x0011).
    Mra(Mra),
    /// ConnectReject (0x0012).
    Rej(Rej),
    /// ConnectReply (0x0013).
    Rep(Rep),
    /// ReadyToUse (0x0014).
    Rtu(Rtu),
    /// DisconnectRequest (0x0015).
    Dreq(Dreq),
    /// DisconnectReply (0x0016).
    Drep(Drep),
}

impl CmMessage {
    /// The attribute ID of this kind of message.
    #[must_use]
    pub const fn attr_id(&self) -> AttrId {
        match self {
            Self::Req(_) => AttrId::Req,
            Self::Mra(_) => AttrId::Mra,
            Self::Rej(_) => AttrId::Rej,
            Self::Rep(_) => AttrId::Rep,
            Self::Rtu(_) => AttrId::Rtu,
            Self::Dreq(_) => AttrId::Dreq,
            Self::Drep(_) => AttrId::Drep,
        }
    }

    /// The sender's Local Communication ID (every message carries one).
    #[must_use]
    pub const fn local_comm_id(&self) -> u32 {
        match self {
            Self::Req(m) => m.local_comm_id,
            Self::Mra(m) => m.local_comm_id,
            Self::Rej(m) => m.local_comm_id,
            Self::Rep(m) => m.local_comm_id,
            Self::Rtu(m) => m.local_comm_id,
            Self::Dreq(m) => m.local_comm_id,
            Self::Drep(m) => m.local_comm_id,
        }
    }

    /// The Remote Communication ID (the receiver's own ID); `None` for a REQ, which has none.
    #[must_use]
    pub const fn remote_comm_id(&self) -> Option<u32> {
        match self {
            Self::Req(_) => None,
            Self::Mra(m) => Some(m.remote_comm_id),
            Self::Rej(m) => Some(m.remote_comm_id),
            Self::Rep(m) => Some(m.remote_comm_id),
            Self::Rtu(m) => Some(m.remote_comm_id),
            Self::Dreq(m) => Some(m.remote_comm_id),
            Self::Drep(m) => Some(m.remote_comm_id),
        }
    }

    /// Decodes the 232 message bytes as attribute `attr`.
    ///
    /// # Errors
    ///
    /// [`CmError::UnsupportedAttribute`] for SIDR_REQ, SIDR_REP, LAP and APR.
    pub fn parse(attr: AttrId, data: &[u8; MAD_DATA_LEN]) -> Result<Self, CmError> {
        Ok(match attr {
            AttrId::Req => Self::Req(Req::from_bytes(data)),
            AttrId::Mra => Self::Mra(Mra::from_bytes(data)),
            AttrId::Rej => Self::Rej(Rej::from_bytes(data)),
            AttrId::Rep => Self::Rep(Rep::from_bytes(data)),
            AttrId::Rtu => Self::Rtu(Rtu::from_bytes(data)),
            AttrId::Dreq => Self::Dreq(Dreq::from_bytes(data)),
            AttrId::Drep => Self::Drep(Drep::from_bytes(data)),
            AttrId::SidrReq | AttrId::SidrRep | AttrId::Lap | AttrId::Apr => {
                return Err(CmError::UnsupportedAttribute(attr.to_u16()))
            }
        })
    }

    /// Encodes the 232 message bytes.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; MAD_DATA_LEN] {
        match self {
            Self::Req(m) => m.to_bytes(),
            Self::Mra(m) => m.to_bytes(),
            Self::Rej(m) => m.to_bytes(),
            Self::Rep(m) => m.to_bytes(),
            Self::Rtu(m) => m.to_bytes(),
            Self::Dreq(m) => m.to_bytes(),
            Self::Drep(m) => m.to_bytes(),
        }
    }
}

/// A whole CM MAD: header and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMad {
    /// The MAD header. [`emit`](Self::emit) overwrites its version, class, method and
    /// attribute ID; the status, class-specific field, TID and attribute modifier are sent
    /// as they are.
    pub header: MadHeader,
    /// The message.
    pub msg: CmMessage,
}

impl CmMad {
    /// A MAD carrying `msg` with a CM header ([`MadHeader::cm`]) for `transaction_id`.
    #[must_use]
    pub const fn new(transaction_id: u64, msg: CmMessage) -> Self {
        Self {
            header: MadHeader::cm(msg.attr_id(), transaction_id),
            msg,
        }
    }

    /// Decodes a CM MAD from the start of `buf`. Bytes past the 256th are ignored (a UD
    /// receive buffer may be longer than the MAD).
    ///
    /// The header is checked in wire order: length of the header, base version, management
    /// class, class version, method, attribute, and then the length of the whole MAD.
    ///
    /// # Errors
    ///
    /// - [`CmError::Truncated`] if `buf` is shorter than the header or, for a valid header,
    ///   than 256 bytes;
    /// - [`CmError::BadBaseVersion`], [`CmError::NotCm`], [`CmError::BadClassVersion`],
    ///   [`CmError::BadMethod`] for a header that is not a CM Send;
    /// - [`CmError::UnknownAttribute`] / [`CmError::UnsupportedAttribute`] for an attribute
    ///   that is not one of the seven connection messages.
    pub fn parse(buf: &[u8]) -> Result<Self, CmError> {
        let header = MadHeader::parse(buf)?;
        if header.base_version != MAD_BASE_VERSION {
            return Err(CmError::BadBaseVersion(header.base_version));
        }
        if header.mgmt_class != CM_MGMT_CLASS {
            return Err(CmError::NotCm(header.mgmt_class));
        }
        if header.class_version != CM_CLASS_VERSION {
            return Err(CmError::BadClassVersion(header.class_version));
        }
        if header.method != METHOD_SEND {
            return Err(CmError::BadMethod(header.method));
        }
        let attr = match AttrId::from_u16(header.attr_id) {
            Some(a) => a,
            None if header.attr_id == ATTR_CLASS_PORT_INFO => {
                return Err(CmError::UnsupportedAttribute(header.attr_id))
            }
            None => return Err(CmError::UnknownAttribute(header.attr_id)),
        };
        let data = buf
            .get(MAD_HEADER_LEN..)
            .and_then(<[u8]>::first_chunk::<MAD_DATA_LEN>)
            .ok_or(CmError::Truncated)?;
        let msg = CmMessage::parse(attr, data)?;
        Ok(Self { header, msg })
    }

    /// Encodes the MAD. The header's base version, class, class version, method and
    /// attribute ID are set from the message ([`MadHeader::cm`]); reserved bytes are zero.
    #[must_use]
    pub fn emit(&self) -> [u8; MAD_LEN] {
        let header = MadHeader {
            base_version: MAD_BASE_VERSION,
            mgmt_class: CM_MGMT_CLASS,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            attr_id: self.msg.attr_id().to_u16(),
            ..self.header
        };
        let mut out = [0u8; MAD_LEN];
        let (h, d) = out.split_at_mut(MAD_HEADER_LEN);
        if let Some(h) = h.first_chunk_mut::<MAD_HEADER_LEN>() {
            *h = header.to_bytes();
        }
        if let Some(d) = d.first_chunk_mut::<MAD_DATA_LEN>() {
            *d = self.msg.to_bytes();
        }
        out
    }
}

/// Linux's approximation of a CM time value in milliseconds (`cm_convert_to_ms`):
/// `1 << max(t - 8, 0)`.
///
/// `t` is a five-bit exponent (response timeouts, service timeout, ACK timeouts); larger
/// values are clamped to 31. It rounds 4.096 µs · 2^t to a power of two in milliseconds: 20
/// gives 4096 ms (exact: 4295 ms), and anything up to 8 gives 1 ms.
#[must_use]
pub fn cm_timeout_ms(t: u8) -> u64 {
    1u64 << u32::from(t.min(31)).saturating_sub(8)
}

/// The exact IBTA time value for exponent `t`: 4.096 µs · 2^t
/// ([`LocalAckTimeout::duration`] of `t` clamped to 31).
///
/// `t` is clamped to 31 (the widest CM time field has five bits; 31 is about 2.4 hours).
/// For the Local ACK Timeout, IBTA gives 0 the special meaning "infinite"; callers handle that
/// themselves, or use [`LocalAckTimeout::retransmit_interval`].
#[must_use]
pub const fn ibta_timeout(t: u8) -> Duration {
    LocalAckTimeout::saturating(t).duration()
}

/// An IBTA Local ACK Timeout: the five-bit exponent `n` of an RC requester's retransmit
/// interval, 4.096 µs · 2^n (`IBV_QP_TIMEOUT`, the REQ's and REP's ACK timeout fields).
///
/// Invariant: the exponent is in `0..=31`. Exponent 0 means "infinite" (no retransmit timer)
/// to a QP; [`duration`](Self::duration) still gives the time value 4.096 µs for it, as the
/// CM time fields read it, and [`retransmit_interval`](Self::retransmit_interval) gives `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct LocalAckTimeout(u8);

impl LocalAckTimeout {
    /// Exponent 0: the QP never retransmits on a timer.
    pub const INFINITE: Self = Self(0);
    /// The largest exponent a five-bit field holds (about 2.4 hours).
    pub const MAX: Self = Self(31);

    /// The timeout for exponent `n`, or `None` if `n` does not fit five bits.
    #[must_use]
    pub const fn new(n: u8) -> Option<Self> {
        if n <= Self::MAX.0 {
            Some(Self(n))
        } else {
            None
        }
    }

    /// The timeout for exponent `n`, clamped to [`MAX`](Self::MAX).
    #[must_use]
    pub const fn saturating(n: u8) -> Self {
        if n <= Self::MAX.0 {
            Self(n)
        } else {
            Self::MAX
        }
    }

    /// The exponent, `0..=31`.
    #[must_use]
    pub const fn exponent(self) -> u8 {
        self.0
    }

    /// The IBTA time value 4.096 µs · 2^n (4.096 µs for exponent 0).
    #[must_use]
    pub const fn duration(self) -> Duration {
        Duration::from_nanos(4096u64 << self.0)
    }

    /// How long a requester waits for an ACK before retransmitting: [`duration`](Self::duration),
    /// or `None` for exponent 0 (infinite).
    #[must_use]
    pub const fn retransmit_interval(self) -> Option<Duration> {
        if self.0 == 0 {
            None
        } else {
            Some(self.duration())
        }
    }
}
