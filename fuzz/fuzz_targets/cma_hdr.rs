//! rdma_cm's `cma_hdr` and port-space service IDs on arbitrary bytes.
//!
//! Nothing may panic; a header that parses re-encodes to one that parses back to the same
//! value (the bytes rdma_cm ignores, the low nibble of byte 1 and an IPv4 address's twelve pad
//! bytes, may differ), and the user data is every byte after the 36th.
#![no_main]

use std::net::IpAddr;

use ipoib_cm::wire::cma::{CmaHdr, PortSpace, CMA_HDR_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((h, user)) = CmaHdr::parse(data) {
        assert_eq!(user.len(), data.len() - CMA_HDR_LEN);
        let pd = h.req_private_data(user).expect("a parsed header re-encodes");
        let (back, back_user) = CmaHdr::parse(&pd).expect("re-parse");
        assert_eq!(back, h);
        assert!(user.starts_with(back_user));
        assert!(h.matches_listener(h.dst));
        let _ = h.matches_listener(IpAddr::from([0u8; 16]));
    }
    if let Some(b) = data.first_chunk::<8>() {
        let sid = u64::from_be_bytes(*b);
        if let Some((ps, port)) = PortSpace::parse_service_id(sid) {
            assert_eq!(ps.service_id(port), sid);
        }
    }
});
