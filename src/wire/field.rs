//! Byte fields: the one place in [`wire`](super) that cuts headers out of buffers and turns
//! big-endian bytes into integers and back.
//!
//! Two shapes of access; neither panics on any input:
//!
//! - On a buffer of unknown length (received bytes), a field is a [`Field`] range and an
//!   access is an `Option`: [`read_array`], [`read_u16`] and [`write_u16`] give `None` (and
//!   write nothing) when the range does not lie inside the buffer or is not the width asked
//!   for. [`head`] and [`take`] cut a fixed-size header off the front the same way.
//! - On a fixed-size array (a header already cut out, a message being built), [`Bytes`] reads
//!   and writes at a const offset, and the offset plus width is checked against the array's
//!   length at compile time: an access outside the array does not build.
//!
//! The one function that panics is [`emit_head`], on a caller's buffer too short for the
//! header it writes (a caller bug, never a property of received bytes).
//!
//! The `const fn` codecs of the fixed headers (`Bth::from_bytes`, `Deth::to_bytes`, …) cannot
//! call trait methods, so they index their own arrays with literal positions; rustc rejects a
//! literal index outside an array at compile time, which gives them the same guarantee.

use core::ops::Range;

/// The bytes of one field, as offsets into its header.
pub type Field = Range<usize>;

/// The first `N` bytes of `buf`, or `None` if it is shorter.
#[inline]
#[must_use]
pub fn head<const N: usize>(buf: &[u8]) -> Option<&[u8; N]> {
    buf.first_chunk::<N>()
}

/// Cuts the first `N` bytes off `buf` and returns them, or returns `None` and leaves `buf` as
/// it was if it is shorter.
#[inline]
pub fn take<'a, const N: usize>(buf: &mut &'a [u8]) -> Option<&'a [u8; N]> {
    let (first, rest) = buf.split_first_chunk::<N>()?;
    *buf = rest;
    Some(first)
}

/// Copies a fixed-size header into the start of `buf`.
///
/// # Panics
///
/// If `buf` is shorter than `N`: the `emit` functions of the fixed headers document this as a
/// caller bug (the caller sizes the buffer), never a property of received bytes.
pub fn emit_head<const N: usize>(buf: &mut [u8], bytes: &[u8; N]) {
    let len = buf.len();
    match buf.first_chunk_mut::<N>() {
        Some(dst) => *dst = *bytes,
        None => panic!("wire: {N}-byte header does not fit a {len}-byte buffer"),
    }
}

/// The bytes of `field` in `buf` as an `N`-byte array, or `None` if the field does not lie
/// inside `buf` or is not `N` bytes wide.
#[inline]
#[must_use]
pub fn read_array<const N: usize>(buf: &[u8], field: Field) -> Option<[u8; N]> {
    buf.get(field)?.try_into().ok()
}

/// The big-endian `u16` in `field` of `buf` (`None` as in the [module docs](self)).
#[inline]
#[must_use]
pub fn read_u16(buf: &[u8], field: Field) -> Option<u16> {
    read_array(buf, field).map(u16::from_be_bytes)
}

/// Writes `v` big-endian into `field` of `buf`; writes nothing and returns `None` if the
/// field does not lie inside `buf` or is not two bytes wide.
#[inline]
pub fn write_u16(buf: &mut [u8], field: Field, v: u16) -> Option<()> {
    let dst: &mut [u8; 2] = buf.get_mut(field)?.try_into().ok()?;
    *dst = v.to_be_bytes();
    Some(())
}

/// Big-endian fields of a fixed-size byte array at offsets checked at compile time.
///
/// `OFF + width <= L` is a `const` assertion, evaluated when the access is compiled to code.
/// Writes of 24-bit fields keep the low 24 bits of the value.
///
/// ```
/// use ipoib_cm::wire::field::Bytes;
///
/// let mut b = [0u8; 8];
/// b.put_be24::<1>(0xAB_CDEF);
/// assert_eq!(b.be32::<0>(), 0x00AB_CDEF);
/// ```
///
/// ```compile_fail
/// use ipoib_cm::wire::field::Bytes;
///
/// let _ = [0u8; 8].be32::<6>(); // bytes 6..10 of an 8-byte array
/// ```
pub trait Bytes {
    /// `N` bytes at offset `OFF`.
    fn bytes<const OFF: usize, const N: usize>(&self) -> [u8; N];

    /// Writes `N` bytes at offset `OFF`.
    fn put_bytes<const OFF: usize, const N: usize>(&mut self, v: [u8; N]);

    /// The big-endian `u16` at `OFF`.
    fn be16<const OFF: usize>(&self) -> u16 {
        u16::from_be_bytes(self.bytes::<OFF, 2>())
    }

    /// The big-endian 24-bit value at `OFF` (three bytes).
    fn be24<const OFF: usize>(&self) -> u32 {
        let [a, b, c] = self.bytes::<OFF, 3>();
        u32::from_be_bytes([0, a, b, c])
    }

    /// The big-endian `u32` at `OFF`.
    fn be32<const OFF: usize>(&self) -> u32 {
        u32::from_be_bytes(self.bytes::<OFF, 4>())
    }

    /// The big-endian `u64` at `OFF`.
    fn be64<const OFF: usize>(&self) -> u64 {
        u64::from_be_bytes(self.bytes::<OFF, 8>())
    }

    /// Writes `v` big-endian at `OFF`.
    fn put_be16<const OFF: usize>(&mut self, v: u16) {
        self.put_bytes::<OFF, 2>(v.to_be_bytes());
    }

    /// Writes the low 24 bits of `v` big-endian at `OFF` (three bytes).
    fn put_be24<const OFF: usize>(&mut self, v: u32) {
        let [_, a, b, c] = v.to_be_bytes();
        self.put_bytes::<OFF, 3>([a, b, c]);
    }

    /// Writes `v` big-endian at `OFF`.
    fn put_be32<const OFF: usize>(&mut self, v: u32) {
        self.put_bytes::<OFF, 4>(v.to_be_bytes());
    }

    /// Writes `v` big-endian at `OFF`.
    fn put_be64<const OFF: usize>(&mut self, v: u64) {
        self.put_bytes::<OFF, 8>(v.to_be_bytes());
    }
}

impl<const L: usize> Bytes for [u8; L] {
    #[inline]
    fn bytes<const OFF: usize, const N: usize>(&self) -> [u8; N] {
        const { assert!(OFF + N <= L, "field outside the array") };
        // The assertion makes the fallback unreachable; it keeps the body free of indexing.
        self.get(OFF..)
            .and_then(<[u8]>::first_chunk::<N>)
            .copied()
            .unwrap_or([0; N])
    }

    #[inline]
    fn put_bytes<const OFF: usize, const N: usize>(&mut self, v: [u8; N]) {
        const { assert!(OFF + N <= L, "field outside the array") };
        if let Some(dst) = self.get_mut(OFF..).and_then(<[u8]>::first_chunk_mut::<N>) {
            *dst = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slice_reads_check_range_and_width() {
        let b = [0x12, 0x34, 0x56, 0x78, 0x9A];
        assert_eq!(read_u16(&b, 1..3), Some(0x3456));
        assert_eq!(read_array::<3>(&b, 2..5), Some([0x56, 0x78, 0x9A]));
        assert_eq!(read_array::<4>(&b, 2..6), None, "past the end");
        assert_eq!(read_u16(&b, 0..3), None, "wrong width");
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 4..2;
        assert_eq!(read_u16(&b, backwards), None);
        assert_eq!(read_u16(&[], 0..2), None);
        let mut w = [0u8; 3];
        assert_eq!(write_u16(&mut w, 1..3, 0xBEEF), Some(()));
        assert_eq!(w, [0, 0xBE, 0xEF]);
        assert_eq!(write_u16(&mut w, 2..4, 1), None);
        assert_eq!(write_u16(&mut w, 0..3, 1), None);
        assert_eq!(w, [0, 0xBE, 0xEF], "a failed write leaves the buffer");
    }

    #[test]
    fn head_and_take() {
        let b = [1u8, 2, 3, 4, 5];
        assert_eq!(head::<2>(&b), Some(&[1, 2]));
        assert_eq!(head::<6>(&b), None);
        let mut rest = &b[..];
        assert_eq!(take::<3>(&mut rest), Some(&[1, 2, 3]));
        assert_eq!(rest, &[4, 5]);
        assert_eq!(take::<3>(&mut rest), None);
        assert_eq!(rest, &[4, 5], "a failed take leaves the buffer");
    }

    #[test]
    fn emit_head_writes_only_the_header() {
        let mut b = [0xAAu8; 4];
        emit_head(&mut b, &[1, 2, 3]);
        assert_eq!(b, [1, 2, 3, 0xAA]);
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn emit_head_into_short_buffer_panics() {
        emit_head(&mut [0u8; 2], &[1, 2, 3]);
    }

    #[test]
    fn array_fields_known_bytes() {
        let mut a = [0u8; 17];
        a.put_be16::<0>(0x0102);
        a.put_be24::<2>(0xFF03_0405);
        a.put_be32::<5>(0x0607_0809);
        a.put_be64::<9>(0x0A0B_0C0D_0E0F_1011);
        assert_eq!(
            a,
            [1, 2, 3, 4, 5, 6, 7, 8, 9, 0xA, 0xB, 0xC, 0xD, 0xE, 0xF, 0x10, 0x11]
        );
        assert_eq!(a.be16::<0>(), 0x0102);
        assert_eq!(a.be24::<2>(), 0x03_0405);
        assert_eq!(a.be32::<5>(), 0x0607_0809);
        assert_eq!(a.be64::<9>(), 0x0A0B_0C0D_0E0F_1011);
        assert_eq!(a.bytes::<15, 2>(), [0x10, 0x11]);
        a.put_bytes::<15, 2>([0xEE, 0xFF]);
        assert_eq!(read_u16(&a, 15..17), Some(0xEEFF));
    }

    proptest! {
        #[test]
        fn array_fields_round_trip(v16 in any::<u16>(), v24 in any::<u32>(), v32 in any::<u32>(), v64 in any::<u64>()) {
            let mut a = [0u8; 17];
            a.put_be16::<0>(v16);
            a.put_be24::<2>(v24);
            a.put_be32::<5>(v32);
            a.put_be64::<9>(v64);
            prop_assert_eq!(a.be16::<0>(), v16);
            prop_assert_eq!(a.be24::<2>(), v24 & 0x00FF_FFFF);
            prop_assert_eq!(a.be32::<5>(), v32);
            prop_assert_eq!(a.be64::<9>(), v64);
            prop_assert_eq!(read_u16(&a, 0..2), Some(v16));
            prop_assert_eq!(read_array::<4>(&a, 5..9), Some(v32.to_be_bytes()));
        }

        #[test]
        fn slice_reads_never_panic(b in proptest::collection::vec(any::<u8>(), 0..8), start in 0usize..10, len in 0usize..6) {
            let field = start..start + len;
            let fits = start + len <= b.len();
            prop_assert_eq!(read_u16(&b, field.clone()).is_some(), fits && len == 2);
            prop_assert_eq!(read_array::<3>(&b, field.clone()).is_some(), fits && len == 3);
            let mut w = b.clone();
            prop_assert_eq!(write_u16(&mut w, field, 0xFFFF).is_some(), fits && len == 2);
        }
    }
}
