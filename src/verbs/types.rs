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

/// A 16-bit partition key: bit 15 is the membership (set: full, clear: limited), the low 15
/// bits name the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PKey(pub u16);

impl PKey {
    /// The default full-member partition key every RoCE port carries.
    pub const DEFAULT: Self = Self(0xFFFF);

    /// The full-membership bit.
    pub const FULL_MEMBER: u16 = 0x8000;

    /// The P_Key as a full member of the same partition: what IPoIB puts in its MGIDs and
    /// broadcast address whatever its own membership (ipoib's `priv->pkey | 0x8000`).
    #[must_use]
    pub const fn full(self) -> Self {
        Self(self.0 | Self::FULL_MEMBER)
    }

    /// Whether this is a full member (bit 15 set); a limited member talks to full members
    /// only.
    pub const fn is_full_member(self) -> bool {
        self.0 & Self::FULL_MEMBER != 0
    }

    /// Whether the IBTA allows it: the low 15 bits are not zero (`0x0000` and `0x8000` are
    /// invalid P_Keys).
    pub const fn is_valid(self) -> bool {
        self.0 & 0x7FFF != 0
    }

    /// Whether `other` names the same partition (equal low 15 bits), whatever the membership:
    /// how a port's P_Key table is searched (`ib_find_pkey`).
    pub const fn same_partition(self, other: Self) -> bool {
        self.0 & 0x7FFF == other.0 & 0x7FFF
    }

    /// Parses `0x8001`-style hex or decimal text into a valid P_Key ([`PKey::is_valid`]).
    ///
    /// # Errors
    /// A one-line message quoting the text: not a 16-bit number, or an invalid P_Key.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let n = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(hex) => u16::from_str_radix(hex, 16),
            None => t.parse::<u16>(),
        }
        .map_err(|_| {
            format!("invalid P_Key {text:?}: expected 0x0001..=0xffff (hex or decimal)")
        })?;
        Self::checked(n).ok_or_else(|| {
            format!(
                "invalid P_Key {text:?}: its low 15 bits are zero (0x0000 and 0x8000 are invalid)"
            )
        })
    }

    /// `n` as a P_Key if it is a valid one ([`PKey::is_valid`]).
    pub const fn checked(n: u16) -> Option<Self> {
        if Self(n).is_valid() {
            Some(Self(n))
        } else {
            None
        }
    }

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
    fn pkey_parse_and_membership() {
        assert_eq!(PKey::parse("0x8001"), Ok(PKey(0x8001)));
        assert_eq!(PKey::parse("0X7fff"), Ok(PKey(0x7FFF)));
        assert_eq!(PKey::parse("32769"), Ok(PKey(0x8001)));
        assert_eq!(PKey::parse("1"), Ok(PKey(0x0001)));
        assert_eq!(PKey::parse("0xffff"), Ok(PKey::DEFAULT));
        for bad in [
            "0", "0x0", "0x8000", "32768", "0x10000", "65536", "-1", "ff", "", "0x",
        ] {
            assert!(PKey::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(PKey::parse("0x8000").unwrap_err().contains("low 15 bits"));
        assert_eq!(PKey(0x0001).full(), PKey(0x8001));
        assert_eq!(PKey(0x8001).full(), PKey(0x8001));
        assert!(!PKey(0x0001).is_full_member() && PKey(0x8001).is_full_member());
        assert!(PKey(0x0001).same_partition(PKey(0x8001)));
        assert!(!PKey(0x8001).same_partition(PKey(0x8002)));
    }

    #[test]
    fn pkey_match_rules() {
        assert!(PKey::DEFAULT.matches(PKey::DEFAULT));
        assert!(PKey(0x7FFF).matches(PKey::DEFAULT));
        assert!(!PKey(0x7FFF).matches(PKey(0x7FFF)));
        assert!(!PKey(0x8000).matches(PKey(0x8000)));
        assert!(!PKey(0xFFFF).matches(PKey(0x8001)));
    }
}
