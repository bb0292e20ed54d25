//! Memory the kernel commits now rather than at first use.

/// Bytes between two writes of [`commit`]: the smallest page size Linux uses.
const PAGE: usize = 4096;

/// Writes every page of `buf` (each page's first byte, with the value it holds), so that the
/// kernel backs it with memory now and charges it to the process's memory cgroup: a limit
/// that cannot hold it ends the process here, at start, instead of under load later. The
/// contents are unchanged.
pub(crate) fn commit(buf: &mut [u8]) {
    // Hidden from the optimiser, which would otherwise drop the writes of a value the
    // allocator's zeroed pages already read as.
    let buf = std::hint::black_box(buf);
    for page in buf.chunks_mut(PAGE) {
        if let Some(b) = page.first_mut() {
            *b = std::hint::black_box(*b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committing_leaves_the_contents_as_they_were() {
        let mut buf: Vec<u8> = (0..3 * PAGE + 5).map(|i| (i % 251) as u8).collect();
        let before = buf.clone();
        commit(&mut buf);
        assert_eq!(buf, before);
        commit(&mut []);
    }
}
