//! The IPoIB link-layer parsers on arbitrary bytes: the encapsulation header, the 20-byte
//! hardware address (bytes and text), ARP, Neighbor Discovery (whole IPv6 packets) and the IP
//! classification of the data path.
//!
//! Nothing may panic; whatever parses must emit bytes that parse back to the same value, and
//! the classification must stay inside the packet it was given.
#![no_main]

use ipoib_cm::wire::ipoib::{
    classify, HwAddr, IpoibArp, IpoibHeader, NdMessage, NeighborAdvertisement, NeighborSolicitation,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = IpoibHeader::parse(data) {
        assert_eq!(IpoibHeader::parse(&h.to_bytes()).ok(), Some(h));
    }
    if let Ok(hw) = HwAddr::parse(data) {
        assert_eq!(HwAddr::parse(&hw.to_bytes()).ok(), Some(hw));
        assert_eq!(hw.to_string().parse::<HwAddr>().ok(), Some(hw));
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(hw) = text.parse::<HwAddr>() {
            assert_eq!(hw.to_string().parse::<HwAddr>().ok(), Some(hw));
        }
    }
    if let Ok(arp) = IpoibArp::parse(data) {
        assert_eq!(IpoibArp::parse(&arp.to_bytes()).ok(), Some(arp));
    }
    if let Ok(info) = classify(data) {
        assert!(info.total_len <= data.len());
        assert!(info.header_len <= info.total_len);
        let payload = info.payload(data).expect("payload inside the packet");
        assert_eq!(payload.len(), info.total_len - info.header_len);
    }
    if let Ok(nd) = NdMessage::parse(data) {
        let _ = nd.target();
    }
    if let Ok(ns) = NeighborSolicitation::parse(data) {
        let again = NeighborSolicitation::parse(&ns.to_packet()).expect("re-parse NS");
        assert_eq!(again, ns);
    }
    if let Ok(na) = NeighborAdvertisement::parse(data) {
        let again = NeighborAdvertisement::parse(&na.to_packet()).expect("re-parse NA");
        assert_eq!(again, na);
    }
});
