//! Subnet Administration MADs (IBTA Vol. 1 chapter 15): the 56-byte SA header ([`SaHeader`]:
//! the common MAD header, the RMPP header, SM_Key, attribute offset and component mask), the
//! records an IPoIB node asks the SA for ([`PathRecord`], [`McMemberRecord`]) and the whole
//! 256-byte MAD ([`SaMad`]).
//!
//! # Layout of an SA MAD
//!
//! | Off | Size | Field |
//! |---|---|---|
//! | 0 | 24 | common MAD header ([`MadHeader`]); class 0x03, class version 2 |
//! | 24 | 12 | RMPP header (version, type, response time and flags, status, two data words) |
//! | 36 | 8 | SM_Key |
//! | 44 | 2 | AttributeOffset, in 8-byte words (the record size in a GetTable response) |
//! | 46 | 2 | reserved |
//! | 48 | 8 | ComponentMask: which record fields a query or join names |
//! | 56 | 200 | the record |
//!
//! Field offsets and component-mask bits follow Linux `include/rdma/ib_sa.h` and
//! `drivers/infiniband/core/sa_query.c` (the `path_rec_table` and `mcmember_rec_table`), which
//! follow IBTA tables 182 (PathRecord) and 187 (MCMemberRecord). Every multi-byte field is
//! big-endian. Fields narrower than their Rust type are masked to their width on emit;
//! reserved bits are written as zero and ignored on receive, so `parse(emit(m)) == m` holds
//! for every value whose fields fit their widths.
//!
//! The IPoIB multicast GIDs the joins name (the IPv4 broadcast group, IPv6 all-nodes and
//! solicited-node groups, each with the P_Key) are built by [`crate::wire::ipoib::mcast`].
//!
//! # Panics
//!
//! Parsing never panics and never allocates.

mod mcmember;
mod path;

#[cfg(test)]
pub(crate) mod tests;

pub use mcmember::{JoinState, McMemberRecord, McMemberRecordMask};
pub use path::{PathRecord, PathRecordMask};

use crate::wire::cm::{MadHeader, MAD_BASE_VERSION, MAD_HEADER_LEN, MAD_LEN};
use crate::wire::field::Bytes;

/// Management class of Subnet Administration (`IB_MGMT_CLASS_SUBN_ADM`).
pub const SA_MGMT_CLASS: u8 = 0x03;

/// Class version of the SA MADs (`IB_SA_CLASS_VERSION`).
pub const SA_CLASS_VERSION: u8 = 2;

/// Size of the SA header: common MAD header, RMPP header, SM_Key, offset and mask.
pub const SA_HEADER_LEN: usize = 56;

/// Size of the record area after the SA header.
pub const SA_DATA_LEN: usize = MAD_LEN - SA_HEADER_LEN;

/// Attribute ID of PathRecord.
pub const ATTR_PATH_RECORD: u16 = 0x0035;

/// Attribute ID of MCMemberRecord.
pub const ATTR_MCMEMBER_RECORD: u16 = 0x0038;

/// The SA methods (IBTA table 180). Responses have bit 7 set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SaMethod {
    /// SubnAdmGet: one record.
    Get = 0x01,
    /// SubnAdmSet: a join.
    Set = 0x02,
    /// SubnAdmGetResp: the answer to Get and Set.
    GetResp = 0x81,
    /// SubnAdmReport.
    Report = 0x06,
    /// SubnAdmReportResp.
    ReportResp = 0x86,
    /// SubnAdmGetTable: every matching record (answered with RMPP).
    GetTable = 0x12,
    /// SubnAdmGetTableResp.
    GetTableResp = 0x92,
    /// SubnAdmDelete: a leave.
    Delete = 0x15,
    /// SubnAdmDeleteResp.
    DeleteResp = 0x95,
}

impl SaMethod {
    /// The method of a method byte, or `None` for one the SA does not define.
    #[must_use]
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x01 => Self::Get,
            0x02 => Self::Set,
            0x81 => Self::GetResp,
            0x06 => Self::Report,
            0x86 => Self::ReportResp,
            0x12 => Self::GetTable,
            0x92 => Self::GetTableResp,
            0x15 => Self::Delete,
            0x95 => Self::DeleteResp,
            _ => return None,
        })
    }

    /// Whether this is a response (bit 7).
    #[must_use]
    pub const fn is_response(self) -> bool {
        self as u8 & 0x80 != 0
    }
}

/// The MAD status word of an SA response: the common bits (0–4) and the SA code (bits 8–10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SaStatus(pub u16);

impl SaStatus {
    /// Success.
    pub const OK: Self = Self(0);

    /// The SA's class code (IBTA table 179): 1 no resources, 2 invalid request, 3 no
    /// records, 4 too many records, 5 invalid GID, 6 insufficient components, 7 denied.
    #[must_use]
    pub const fn sa_code(self) -> u8 {
        ((self.0 >> 8) & 0x7) as u8
    }

    /// Whether the SA found no record matching the query (`ERR_NO_RECORDS`).
    #[must_use]
    pub const fn is_no_records(self) -> bool {
        self.sa_code() == 3
    }

    /// The busy bit: the SA asks the requester to retry later.
    #[must_use]
    pub const fn is_busy(self) -> bool {
        self.0 & 0x1 != 0
    }

    /// Whether the request succeeded.
    #[must_use]
    pub const fn is_ok(self) -> bool {
        self.0 == 0
    }
}

/// Why an SA MAD could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum SaError {
    /// The buffer is shorter than the 256-byte MAD.
    #[error("truncated SA MAD")]
    Truncated,
    /// The MAD base version is not 1.
    #[error("unsupported MAD base version {0}")]
    BadBaseVersion(u8),
    /// The management class is not [`SA_MGMT_CLASS`].
    #[error("management class {0:#04x} is not SA")]
    NotSa(u8),
    /// The class version is not [`SA_CLASS_VERSION`].
    #[error("unsupported SA class version {0}")]
    BadClassVersion(u8),
    /// The method byte is not an SA method.
    #[error("unknown SA method {0:#04x}")]
    UnknownMethod(u8),
}

/// The 56-byte SA header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SaHeader {
    /// The common MAD header (class [`SA_MGMT_CLASS`], version [`SA_CLASS_VERSION`]).
    pub mad: MadHeader,
    /// The 12-byte RMPP header, kept as bytes: requests send zeros, and only GetTable
    /// responses (which this crate does not ask for) use it.
    pub rmpp: [u8; 12],
    /// SM_Key; 0 from every requester that is not an SM.
    pub sm_key: u64,
    /// AttributeOffset: the record size in 8-byte words in a GetTable response, else 0.
    pub attr_offset: u16,
    /// Which fields of the record the request names (the record type's mask bits).
    pub comp_mask: u64,
}

impl SaHeader {
    /// A request header: base version 1, class 3 version 2, status 0, no RMPP, SM_Key 0.
    #[must_use]
    pub const fn request(method: SaMethod, attr_id: u16, tid: u64, comp_mask: u64) -> Self {
        Self {
            mad: MadHeader {
                base_version: MAD_BASE_VERSION,
                mgmt_class: SA_MGMT_CLASS,
                class_version: SA_CLASS_VERSION,
                method: method as u8,
                status: 0,
                class_specific: 0,
                transaction_id: tid,
                attr_id,
                attr_mod: 0,
            },
            rmpp: [0; 12],
            sm_key: 0,
            attr_offset: 0,
            comp_mask,
        }
    }

    /// Decodes 56 bytes; no field is checked.
    #[must_use]
    pub fn from_bytes(b: &[u8; SA_HEADER_LEN]) -> Self {
        Self {
            mad: MadHeader::from_bytes(&b.bytes::<0, MAD_HEADER_LEN>()),
            rmpp: b.bytes::<24, 12>(),
            sm_key: b.be64::<36>(),
            attr_offset: b.be16::<44>(),
            comp_mask: b.be64::<48>(),
        }
    }

    /// Encodes 56 bytes; the reserved bytes 46–47 are zero.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; SA_HEADER_LEN] {
        let mut b = [0u8; SA_HEADER_LEN];
        b.put_bytes::<0, MAD_HEADER_LEN>(self.mad.to_bytes());
        b.put_bytes::<24, 12>(self.rmpp);
        b.put_be64::<36>(self.sm_key);
        b.put_be16::<44>(self.attr_offset);
        b.put_be64::<48>(self.comp_mask);
        b
    }

    /// The method, known to be an SA method once [`SaMad::parse`] accepted the MAD.
    #[must_use]
    pub const fn method(&self) -> Option<SaMethod> {
        SaMethod::from_u8(self.mad.method)
    }

    /// The status word.
    #[must_use]
    pub const fn status(&self) -> SaStatus {
        SaStatus(self.mad.status)
    }
}

/// One SA MAD: the header and the 200-byte record area, undecoded until the caller asks
/// for the record its attribute names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SaMad {
    /// The header.
    pub header: SaHeader,
    /// The record area (the first record of a table).
    pub data: [u8; SA_DATA_LEN],
}

impl SaMad {
    /// A MAD carrying `record` (its first bytes; the rest of the area is zero).
    #[must_use]
    pub fn new<const N: usize>(header: SaHeader, record: &[u8; N]) -> Self {
        let mut data = [0u8; SA_DATA_LEN];
        if let Some(dst) = data.first_chunk_mut::<N>() {
            *dst = *record;
        }
        Self { header, data }
    }

    /// Decodes a 256-byte SA MAD (bytes past the 256th are ignored), checking base version,
    /// class, class version and method, in that order.
    ///
    /// # Errors
    ///
    /// [`SaError`] for a short buffer or a MAD that is not an SA MAD of class version 2.
    pub fn parse(buf: &[u8]) -> Result<Self, SaError> {
        let b = buf.first_chunk::<MAD_LEN>().ok_or(SaError::Truncated)?;
        let (head, data) = b
            .split_first_chunk::<SA_HEADER_LEN>()
            .ok_or(SaError::Truncated)?;
        let header = SaHeader::from_bytes(head);
        let m = &header.mad;
        if m.base_version != MAD_BASE_VERSION {
            return Err(SaError::BadBaseVersion(m.base_version));
        }
        if m.mgmt_class != SA_MGMT_CLASS {
            return Err(SaError::NotSa(m.mgmt_class));
        }
        if m.class_version != SA_CLASS_VERSION {
            return Err(SaError::BadClassVersion(m.class_version));
        }
        if SaMethod::from_u8(m.method).is_none() {
            return Err(SaError::UnknownMethod(m.method));
        }
        let data: [u8; SA_DATA_LEN] = data.try_into().map_err(|_| SaError::Truncated)?;
        Ok(Self { header, data })
    }

    /// Encodes the 256-byte MAD.
    #[must_use]
    pub fn emit(&self) -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        b.put_bytes::<0, SA_HEADER_LEN>(self.header.to_bytes());
        b.put_bytes::<SA_HEADER_LEN, SA_DATA_LEN>(self.data);
        b
    }

    /// The first `N` bytes of the record area.
    #[must_use]
    pub fn record<const N: usize>(&self) -> [u8; N] {
        self.data.bytes::<0, N>()
    }

    /// The PathRecord this MAD carries (meaningful when the attribute is
    /// [`ATTR_PATH_RECORD`]).
    #[must_use]
    pub fn path_record(&self) -> PathRecord {
        PathRecord::from_bytes(&self.record())
    }

    /// The MCMemberRecord this MAD carries (meaningful when the attribute is
    /// [`ATTR_MCMEMBER_RECORD`]).
    #[must_use]
    pub fn mcmember_record(&self) -> McMemberRecord {
        McMemberRecord::from_bytes(&self.record())
    }
}

/// A PathRecord/MCMemberRecord selector (IBTA 15.2.5.16): how the SA may pick MTU, rate or
/// packet lifetime relative to the value named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Selector {
    /// Greater than the value.
    GreaterThan = 0,
    /// Less than the value.
    LessThan = 1,
    /// Exactly the value.
    Exactly = 2,
    /// The largest available (the value is ignored).
    Largest = 3,
}

impl Selector {
    /// From the two selector bits.
    #[must_use]
    pub const fn from_bits(v: u8) -> Self {
        match v & 0x3 {
            0 => Self::GreaterThan,
            1 => Self::LessThan,
            2 => Self::Exactly,
            _ => Self::Largest,
        }
    }
}

/// A selector and a six-bit value in one byte (MTU, rate, packet lifetime).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Selected {
    /// How the SA may choose.
    pub selector: Selector,
    /// The IB code (MTU enum 1..=5, rate enum, packet lifetime exponent); six bits.
    pub value: u8,
}

impl Selected {
    /// `selector` applied to `value`.
    #[must_use]
    pub const fn new(selector: Selector, value: u8) -> Self {
        Self {
            selector,
            value: value & 0x3f,
        }
    }

    /// From the byte: selector in bits 7–6, value in bits 5–0.
    #[must_use]
    pub const fn from_byte(b: u8) -> Self {
        Self::new(Selector::from_bits(b >> 6), b)
    }

    /// To the byte.
    #[must_use]
    pub const fn to_byte(self) -> u8 {
        ((self.selector as u8) << 6) | (self.value & 0x3f)
    }
}
