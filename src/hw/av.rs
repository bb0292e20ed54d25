//! [`AddressVector`] ↔ `ibv_ah_attr`: the one conversion the address handles and the RC
//! primary path (`IBV_QP_AV`) share.
//!
//! Every field travels: DLID, SL, source path bits, static rate, and the GRH with
//! `is_global = 1` only when the address vector has one (an IB subnet-local route has none;
//! RoCE ports require it, and the kernel refuses an address handle without it there).

use crate::verbs::{AddressVector, Gid};
#[cfg(test)]
use crate::verbs::{Grh, Lid, Rate, Sl};
use ibverbs_sys as ffi;

/// The `ibv_ah_attr` of `av` on `port`; a GRH without an SGID index takes `sgid_index`, and
/// its DGID goes through `dgid` (the provider's multicast mapping).
pub(super) fn to_ah_attr(
    av: &AddressVector,
    port: u8,
    sgid_index: u8,
    dgid: impl Fn(Gid) -> Gid,
) -> ffi::ibv_ah_attr {
    // SAFETY: ibv_ah_attr is a plain C struct; all-zero is valid.
    let mut a: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
    a.dlid = av.dlid.0;
    a.sl = av.sl.get();
    a.src_path_bits = av.src_path_bits;
    a.static_rate = av.static_rate.0;
    a.port_num = port;
    if let Some(g) = av.grh {
        a.is_global = 1;
        a.grh.dgid = ffi::ibv_gid {
            raw: dgid(g.dgid).0,
        };
        a.grh.sgid_index = g.sgid_index.unwrap_or(sgid_index);
        a.grh.flow_label = g.flow_label & 0x000F_FFFF;
        a.grh.hop_limit = g.hop_limit;
        a.grh.traffic_class = g.traffic_class;
    }
    a
}

#[cfg(test)]
/// The address vector an `ibv_ah_attr` describes (what `rdma_init_qp_attr` fills); the SGID
/// index is kept in the GRH.
pub(super) fn from_ah_attr(a: &ffi::ibv_ah_attr) -> AddressVector {
    let grh = (a.is_global != 0).then(|| {
        // SAFETY: `ibv_gid` is a union of a 16-byte array and two u64s: every bit pattern
        // is a valid `[u8; 16]`.
        let dgid = unsafe { a.grh.dgid.raw };
        Grh {
            dgid: Gid(dgid),
            sgid_index: Some(a.grh.sgid_index),
            flow_label: a.grh.flow_label & 0x000F_FFFF,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        }
    });
    AddressVector {
        dlid: Lid(a.dlid),
        sl: Sl::from_bits(a.sl),
        src_path_bits: a.src_path_bits,
        static_rate: Rate(a.static_rate),
        grh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ib_lid_route_is_not_global_and_keeps_dlid_sl_rate() {
        let av = AddressVector {
            src_path_bits: 1,
            static_rate: Rate(7),
            ..AddressVector::to_lid(Lid(0x0012), Sl::new(5).unwrap())
        };
        let a = to_ah_attr(&av, 1, 3, |g| g);
        assert_eq!(a.is_global, 0);
        assert_eq!(
            (a.dlid, a.sl, a.src_path_bits, a.static_rate),
            (0x12, 5, 1, 7)
        );
        assert_eq!(a.port_num, 1);
        // SAFETY: reading the union's byte view, valid for every bit pattern.
        assert_eq!(unsafe { a.grh.dgid.raw }, [0; 16]);
        assert_eq!(from_ah_attr(&a), av);
    }

    #[test]
    fn a_grh_route_sets_is_global_and_round_trips() {
        let dgid = Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        let av = AddressVector {
            dlid: Lid(0x0040),
            sl: Sl::new(2).unwrap(),
            src_path_bits: 0,
            static_rate: Rate(3),
            grh: Some(Grh {
                dgid,
                sgid_index: None,
                flow_label: 0x1_2345,
                hop_limit: 7,
                traffic_class: 0x48,
            }),
        };
        let a = to_ah_attr(&av, 2, 1, |g| g);
        assert_eq!(a.is_global, 1);
        assert_eq!((a.dlid, a.sl, a.static_rate, a.port_num), (0x40, 2, 3, 2));
        assert_eq!(
            (a.grh.sgid_index, a.grh.hop_limit, a.grh.traffic_class),
            (1, 7, 0x48)
        );
        assert_eq!(a.grh.flow_label, 0x1_2345);
        let back = from_ah_attr(&a);
        let want = AddressVector {
            grh: av.grh.map(|g| Grh {
                sgid_index: Some(1),
                ..g
            }),
            ..av
        };
        assert_eq!(back, want);
        // An explicit SGID index wins over the provider's.
        let pinned = AddressVector {
            grh: want.grh,
            ..av
        };
        assert_eq!(to_ah_attr(&pinned, 2, 9, |g| g).grh.sgid_index, 1);
    }
}
