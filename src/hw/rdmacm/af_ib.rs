//! `AF_IB` addresses for rdma_cm (`struct sockaddr_ib`, `<infiniband/ib.h>`): a GID, a raw
//! service ID and a P_Key, the only kind of rdma_cm address that names a service ID outside
//! rdma_cm's port spaces (IPoIB-CM's `0x1000000000000000 | QPN`).
//!
//! On RoCE the kernel refuses them (`../shared/reference/native-ib.md` §2, measured in the
//! lab's `rdmacm` check, `docs/kernel-cm.md`); they are here for that negative case and for
//! InfiniBand, where they are what reaches a kernel `ipoib_cm` peer's service ID.

use crate::verbs::Gid;

use super::ffi;

/// `AF_IB` (`<infiniband/ib.h>`: 27, as glibc's `PF_IB`).
pub(super) const AF_IB: u16 = 27;

/// An `AF_IB` address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbAddr {
    /// The port GID (`sib_addr`).
    pub gid: Gid,
    /// The service ID (`sib_sid`; the mask is all ones when it is nonzero, else zero).
    pub service_id: u64,
    /// The partition (`sib_pkey`).
    pub pkey: u16,
}

impl IbAddr {
    /// `sockaddr_ib` in the C layout, network byte order where the header says `__be`.
    pub(super) fn to_c(self) -> ffi::sockaddr_ib {
        let mut a = ffi::sockaddr_ib {
            sib_family: AF_IB,
            sib_pkey: self.pkey.to_be(),
            sib_sid: self.service_id.to_be(),
            sib_sid_mask: if self.service_id == 0 { 0 } else { u64::MAX },
            ..ffi::sockaddr_ib::default()
        };
        a.sib_addr.ib_u.uib_addr8 = self.gid.0;
        a
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    /// The layout of `<infiniband/ib.h>` (the generated struct's own layout tests check it
    /// against the C compiler's).
    #[test]
    fn sockaddr_ib_is_the_headers_layout() {
        assert_eq!(size_of::<ffi::sockaddr_ib>(), 48);
        assert_eq!(offset_of!(ffi::sockaddr_ib, sib_pkey), 2);
        assert_eq!(offset_of!(ffi::sockaddr_ib, sib_addr), 8);
        assert_eq!(offset_of!(ffi::sockaddr_ib, sib_sid), 24);
        assert_eq!(offset_of!(ffi::sockaddr_ib, sib_sid_mask), 32);
    }

    #[test]
    fn fields_are_big_endian_and_the_mask_follows_the_sid() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 0, 2, 15]);
        let a = IbAddr {
            gid: Gid(g),
            service_id: 0x1000_0000_0000_0011,
            pkey: 0xffff,
        }
        .to_c();
        assert_eq!(a.sib_family, 27);
        assert_eq!(a.sib_sid.to_ne_bytes(), [0x10, 0, 0, 0, 0, 0, 0, 0x11]);
        assert_eq!(a.sib_sid_mask, u64::MAX);
        assert_eq!(a.sib_pkey.to_ne_bytes(), [0xff, 0xff]);
        // SAFETY: reading the union's byte view of what was written as bytes.
        let bytes = unsafe { a.sib_addr.ib_u.uib_addr8 };
        assert_eq!(bytes, g);
        let any = IbAddr {
            gid: Gid([0; 16]),
            service_id: 0,
            pkey: 0xffff,
        }
        .to_c();
        assert_eq!(any.sib_sid_mask, 0);
    }
}
