//! Identifiers and small value types shared by every provider: keys, QP states and types, and
//! the handles the [`Verbs`](super::Verbs) trait lends out. The identifiers the wire formats
//! carry (QPNs, PSNs, GIDs, path MTUs) are defined in [`wire`](crate::wire) and re-exported
//! here.

pub use crate::wire::{Gid, PathMtu, Psn, QpNum};

/// A 32-bit queue key, checked on every UD receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QKey(pub u32);

impl QKey {
    /// The Q_Key of QP1 (`GSI_QKEY`); rxe drops QP1 traffic with any other key.
    pub const GSI: Self = Self(0x8001_0000);
}

/// A 16-bit partition key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PKey(pub u16);

impl PKey {
    /// The default full-member partition key every RoCE port carries.
    pub const DEFAULT: Self = Self(0xFFFF);

    /// IBTA P_Key match (rxe `pkey_match`): equal non-zero low 15 bits and at least one full
    /// member.
    pub fn matches(self, other: Self) -> bool {
        let (a, b) = (self.0, other.0);
        (a & 0x7FFF) != 0 && (a & 0x7FFF) == (b & 0x7FFF) && ((a | b) & 0x8000) != 0
    }
}

/// IBTA queue pair states (`IBV_QPS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, nothing allowed.
    Reset,
    /// Receives may be posted; nothing is processed.
    Init,
    /// Ready to receive: incoming requests are processed.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained: no new send WQEs are started.
    Sqd,
    /// Send queue error (UD only in practice).
    Sqe,
    /// Error: every WR completes with `WrFlushErr`.
    Err,
}

impl QpState {
    /// Lowercase name as used in logs and status output.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Reset => "reset",
            Self::Init => "init",
            Self::Rtr => "rtr",
            Self::Rts => "rts",
            Self::Sqd => "sqd",
            Self::Sqe => "sqe",
            Self::Err => "err",
        }
    }
}

/// Queue pair transport types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable datagram.
    Ud,
    /// QP1, the General Services Interface (a UD QP with Q_Key `0x80010000`).
    Gsi,
}

/// A protection domain handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PdId(pub u32);

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqId(pub u32);

/// A shared receive queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqId(pub u32);

/// A registered buffer pool handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub u16);

/// One buffer of a registered pool. Lent to the provider while a WR that uses it is posted,
/// returned by the completion that ends the WR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufId {
    /// The pool.
    pub pool: PoolId,
    /// Index within the pool.
    pub index: u32,
}

/// The caller's 64-bit work request id, returned verbatim in the completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct WrId(pub u64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkey_match_rules() {
        assert!(PKey::DEFAULT.matches(PKey::DEFAULT));
        assert!(PKey(0x7FFF).matches(PKey::DEFAULT));
        assert!(!PKey(0x7FFF).matches(PKey(0x7FFF)));
        assert!(!PKey(0x8000).matches(PKey(0x8000)));
        assert!(!PKey(0xFFFF).matches(PKey(0x8001)));
    }
}
