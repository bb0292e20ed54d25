//! The P_Key table of the port: where a partition's P_Key sits, for the QPs' `pkey_index`.

use std::io;

use ibverbs_sys as ffi;

use super::HwVerbs;
use crate::verbs::{PKey, VerbsError};

/// The index of `pkey`'s partition in the port's P_Key table, read entry by entry with
/// `ibv_query_pkey` (as `ib_find_pkey`): the first full member of the same partition, else
/// the first limited one.
///
/// # Errors
/// [`VerbsError::NoSuchPKey`] when the port carries no P_Key of the partition (the SM has not
/// put this port in it); [`VerbsError::Io`] when the port or an entry cannot be read.
pub(super) fn find(v: &HwVerbs, pkey: PKey) -> Result<u16, VerbsError> {
    // SAFETY: ibv_port_attr is a plain C struct; all-zero is valid.
    let mut pa: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: `v.ctx` is an open context; the exported ibv_query_port writes a full
    // `ibv_port_attr` through the out pointer.
    let rc = unsafe { ffi::ibv_query_port(v.ctx, v.port, (&raw mut pa).cast()) };
    if rc != 0 {
        let e = io::Error::from_raw_os_error(rc.abs());
        return Err(VerbsError::Io(format!(
            "ibv_query_port({} port {}): {e}",
            v.name, v.port
        )));
    }
    let mut limited = None;
    for i in 0..pa.pkey_tbl_len {
        let mut raw: ffi::__be16 = 0;
        // SAFETY: `v.ctx` is an open context, `i` is below the table length and `raw` a
        // valid out pointer for one big-endian 16-bit entry.
        let rc = unsafe { ffi::ibv_query_pkey(v.ctx, v.port, i32::from(i), &mut raw) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            return Err(VerbsError::Io(format!(
                "ibv_query_pkey({} port {} index {i}): {e}",
                v.name, v.port
            )));
        }
        let entry = PKey(u16::from_be(raw));
        if !entry.is_valid() || !entry.same_partition(pkey) {
            continue;
        }
        if entry.is_full_member() {
            return Ok(i);
        }
        limited.get_or_insert(i);
    }
    limited.ok_or(VerbsError::NoSuchPKey(pkey.0))
}
