//! How the ICRC of an IPv4 RoCEv2 datagram depends on its IP Identification, which the ICRC
//! covers and a plain UDP socket never sees: the sender's side (UDP GSO segments carry IDs
//! 0, 1, 2, ...) and the receiver's (solving for the ID that explains a received ICRC).
//!
//! The linearity this rests on and the false-accept probability it leaves are in
//! [`Ipv4IdShift`]'s docs.

use crc32fast::Hasher;

use super::{ICRC_LEN, UDP_HEADER_LEN};

/// Most segments in one UDP GSO train this crate sends: the kernel's `UDP_MAX_SEGMENTS` on
/// kernels before 6.9 (later ones take 128).
pub const GSO_MAX_SEGMENTS: usize = 64;

/// Bits of the IPv4 Identification field.
const ID_BITS: usize = 16;

/// The reflected CRC-32 polynomial (zlib's).
const POLY: u32 = 0xEDB8_8320;

/// Bytes of the ICRC input that follow the IPv4 Identification field, for a datagram (the UDP
/// payload, ICRC included) of `datagram_len` bytes: the rest of the IPv4 header (14), the UDP
/// header (8) and the datagram without its ICRC.
const fn bytes_after_ipv4_id(datagram_len: usize) -> usize {
    14 + UDP_HEADER_LEN + datagram_len.saturating_sub(ICRC_LEN)
}

/// One zero bit through the raw (reflected) CRC register.
const fn step(crc: u32) -> u32 {
    (crc >> 1) ^ if crc & 1 != 0 { POLY } else { 0 }
}

/// One row of the reduced basis: `diff` is `L(id)`, and its highest set bit, `pivot`, is set
/// in no other row's `diff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Row {
    diff: u32,
    pivot: u32,
    id: u16,
}

/// How the ICRC of an IPv4 RoCEv2 datagram of one length changes with its IP Identification.
///
/// UDP GSO sends a train of datagrams with one `sendmsg`; the kernel cuts it into segments
/// and numbers their IPv4 IDs from the socket's (0 for an unconnected DF socket) upwards:
/// segment `k` carries ID `k` (`inet_gso_segment`). The ICRC covers the ID, so the sender
/// XORs [`delta(k)`](Self::delta) into the ICRC it computed with ID 0.
///
/// A receiver, which sees no IP header, takes the received ICRC XOR the one computed with ID
/// 0 and asks [`solve`](Self::solve) for the ID that explains it: a GSO segment index from
/// our own peers, any ID at all from a sender that picks its own (Linux `rdma_rxe` hashes
/// them, `__ip_select_ident`).
///
/// # Linearity
///
/// The CRC is linear over GF(2): changing some input bits XORs the CRC with the CRC, from a
/// zero state and without the final inversion, of just the changed bits followed by the rest
/// of the input as zeros. For the 16 ID bits that depends only on how many bytes follow the
/// ID, that is on the datagram length. So for one length the ICRC with ID `x` is the ICRC
/// with ID 0 XOR `L(x)`, where `L` is a linear map from 16 bits to 32 (one basis value per
/// ID bit).
///
/// `L` is one-to-one: in polynomial terms it multiplies the ID by a power of `z` modulo the
/// CRC polynomial, and `z` is invertible modulo it (the polynomial's constant term is 1). So
/// a received ICRC is explained by at most one ID, found by Gaussian elimination
/// ([`Ipv4IdShift::solve`]).
///
/// # What accepting any ID costs
///
/// A receiver that accepts a datagram iff *some* ID explains its ICRC accepts a corrupted one
/// iff the corruption's CRC difference `L(e)` lands in the image of `L` (the image is a
/// subspace, so that does not depend on the ID the sender really used). For corruption that
/// the CRC does not detect by construction, the difference is as good as uniform over the
/// 2^32 values; the image holds 2^16 of them. The residual false-accept probability is
/// therefore 2^16 / 2^32 = **2^-16 per corrupted packet** (about 1.5e-5), instead of 2^-32
/// when the ID is known. It applies only to IPv4 datagrams whose ICRC fails with ID 0 (IPv6
/// has no ID and is checked exactly); every other covered byte is still checked. Single-bit
/// errors stay always detected: no single bit after the ID, at any position of a datagram up
/// to 9 KiB, has a CRC difference in the image (checked exhaustively by a test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4IdShift {
    datagram_len: usize,
    /// `basis[b]`: the ICRC change of ID bit `b` alone.
    basis: [u32; ID_BITS],
    /// The basis in reduced echelon form (full rank: `L` is one-to-one).
    rows: [Row; ID_BITS],
}

impl Ipv4IdShift {
    /// The shifts for datagrams of `datagram_len` bytes (BTH … ICRC). Costs one CRC pass over
    /// the datagram's length of zeros and a few hundred bit operations; cache it per length
    /// ([`Ipv4IdShiftCache`]).
    #[must_use]
    pub fn new(datagram_len: usize) -> Self {
        static ZEROS: [u8; 4096] = [0; 4096];
        // The ID is fed big-endian and each byte least significant bit first, so the last ID
        // bit into the CRC is bit 7 (the low byte's top bit); each bit fed before it sees one
        // more zero bit after it, one `step`. The order, last fed first: 7..=0, then 15..=8.
        // crc32fast keeps the finalized value as its state; initial !0 is the raw zero state,
        // and inverting the result undoes the final XOR.
        let mut h = Hasher::new_with_initial(u32::MAX);
        h.update(&(1u16 << 7).to_be_bytes());
        let mut left = bytes_after_ipv4_id(datagram_len);
        while left > 0 {
            let n = left.min(ZEROS.len());
            h.update(ZEROS.get(..n).unwrap_or_default());
            left -= n;
        }
        let mut basis = [0u32; ID_BITS];
        let mut c = !h.finalize();
        for bit in (0..8).rev().chain((8..16).rev()) {
            if let Some(b) = basis.get_mut(bit) {
                *b = c;
            }
            c = step(c);
        }
        Self {
            datagram_len,
            basis,
            rows: reduce(&basis),
        }
    }

    /// The datagram length these shifts are for.
    #[must_use]
    pub const fn datagram_len(&self) -> usize {
        self.datagram_len
    }

    /// What to XOR into the ICRC computed with IP ID 0 to get the ICRC with ID `segment`
    /// (taken modulo 2^16, as the kernel's IDs wrap).
    #[must_use]
    pub fn delta(&self, segment: usize) -> u32 {
        self.basis
            .iter()
            .enumerate()
            .filter(|(bit, _)| segment & (1 << bit) != 0)
            .fold(0, |acc, (_, b)| acc ^ b)
    }

    /// The IPv4 ID whose [`delta`](Self::delta) is `diff` (the received ICRC XOR the one
    /// computed with ID 0), if there is one; there is at most one. `Some(0)` for `diff` 0.
    /// Sixteen steps, no table.
    #[must_use]
    pub fn solve(&self, diff: u32) -> Option<u16> {
        let mut left = diff;
        let mut id = 0u16;
        for r in &self.rows {
            if left & r.pivot != 0 {
                left ^= r.diff;
                id ^= r.id;
            }
        }
        (left == 0).then_some(id)
    }

    /// The GSO segment index in `1..GSO_MAX_SEGMENTS` whose [`delta`](Self::delta) is
    /// `diff`, if any: [`solve`](Self::solve) limited to the IDs our own senders use.
    #[must_use]
    pub fn segment_for(&self, diff: u32) -> Option<usize> {
        self.solve(diff)
            .map(usize::from)
            .filter(|&k| (1..GSO_MAX_SEGMENTS).contains(&k))
    }
}

/// Gauss-Jordan elimination of the basis: rows whose pivots are each set in one row only.
/// A basis value that reduces to 0 (impossible: `L` is one-to-one) would leave its row empty,
/// which [`Ipv4IdShift::solve`] skips.
fn reduce(basis: &[u32; ID_BITS]) -> [Row; ID_BITS] {
    let mut rows = [Row::default(); ID_BITS];
    let mut n = 0;
    for (bit, &b) in basis.iter().enumerate() {
        let mut diff = b;
        let mut id = 1u16 << bit;
        for r in rows.iter().take(n) {
            if diff & r.pivot != 0 {
                diff ^= r.diff;
                id ^= r.id;
            }
        }
        if diff == 0 {
            continue;
        }
        let pivot = 1u32 << (31 - diff.leading_zeros());
        for r in rows.iter_mut().take(n) {
            if r.diff & pivot != 0 {
                r.diff ^= diff;
                r.id ^= id;
            }
        }
        if let Some(slot) = rows.get_mut(n) {
            *slot = Row { diff, pivot, id };
            n += 1;
        }
    }
    rows
}

/// A few [`Ipv4IdShift`]s by datagram length, replaced round-robin: a stream's datagrams come
/// in a handful of lengths (full-MTU segments, message tails, ACKs). A miss costs what
/// [`Ipv4IdShift::new`] does.
#[derive(Debug, Clone, Default)]
pub struct Ipv4IdShiftCache {
    entries: Vec<Ipv4IdShift>,
    next: usize,
}

impl Ipv4IdShiftCache {
    /// Entries kept.
    const ENTRIES: usize = 16;

    /// The shifts for `datagram_len`, computed on a miss.
    pub fn get(&mut self, datagram_len: usize) -> Ipv4IdShift {
        self.with(datagram_len, |s| *s)
    }

    /// [`Ipv4IdShift::delta`] for datagrams of `datagram_len` bytes.
    pub fn delta(&mut self, datagram_len: usize, segment: usize) -> u32 {
        self.with(datagram_len, |s| s.delta(segment))
    }

    /// [`Ipv4IdShift::solve`] for datagrams of `datagram_len` bytes.
    pub fn solve(&mut self, datagram_len: usize, diff: u32) -> Option<u16> {
        self.with(datagram_len, |s| s.solve(diff))
    }

    /// [`Ipv4IdShift::segment_for`] for datagrams of `datagram_len` bytes.
    pub fn segment_for(&mut self, datagram_len: usize, diff: u32) -> Option<usize> {
        self.with(datagram_len, |s| s.segment_for(diff))
    }

    /// Runs `f` on the cached shifts for `datagram_len` (computed and cached on a miss),
    /// without copying the table out.
    fn with<R>(&mut self, datagram_len: usize, f: impl FnOnce(&Ipv4IdShift) -> R) -> R {
        if let Some(e) = self.entries.iter().find(|e| e.datagram_len == datagram_len) {
            return f(e);
        }
        let shift = Ipv4IdShift::new(datagram_len);
        let out = f(&shift);
        if self.entries.len() < Self::ENTRIES {
            self.entries.push(shift);
        } else {
            let i = self.next % Self::ENTRIES;
            self.next = i + 1;
            if let Some(slot) = self.entries.get_mut(i) {
                *slot = shift;
            }
        }
        out
    }
}

/// XORs `delta` into the ICRC trailer of `datagram` (its last four bytes); a datagram shorter
/// than that is left alone.
pub fn shift_icrc(datagram: &mut [u8], delta: u32) {
    if let Some(t) = datagram.last_chunk_mut::<ICRC_LEN>() {
        *t = (u32::from_le_bytes(*t) ^ delta).to_le_bytes();
    }
}

#[cfg(test)]
mod tests;
