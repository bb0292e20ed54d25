//! No panics on any input: the pure parsers of the daemon's operator surface.

use std::path::Path;

use ipoib_cm::daemon::config::{parse_config_file, parse_duration, resolve_str, Cidr, Settings};
use ipoib_cm::daemon::control::{parse_request, parse_response};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn text_parsers_never_panic(s in "\\PC{0,64}") {
        let _ = parse_duration(&s);
        let _ = s.parse::<Cidr>();
        let _ = s.parse::<ipoib_cm::wire::ipoib::HwAddr>();
        let _ = parse_response(&s);
        let _ = parse_request(s.as_bytes());
    }

    #[test]
    fn request_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = parse_request(&b);
    }

    #[test]
    fn config_text_never_panics_and_errors_are_one_line(
        key in prop_oneof![
            Just("rx_timeout"), Just("addr"), Just("max_conn_qp"), Just("mode"),
            Just("path_mtu"), Just("fault_loss"), Just("quirk"), Just("bogus"), Just("ifname"),
        ],
        value in prop_oneof![
            "\"\\PC{0,12}\"".prop_map(|s| s),
            any::<i64>().prop_map(|v| v.to_string()),
            any::<f64>().prop_map(|v| format!("{v:?}")),
            Just("true".to_owned()),
            Just("[\"a\", 1]".to_owned()),
            "\\PC{0,12}".prop_map(|s| s),
        ],
    ) {
        let text = format!("bind = \"10.0.0.1\"\n{key} = {value}\n");
        let path = Path::new("/f.toml");
        let _ = parse_config_file(path, &text);
        if let Err(e) = resolve_str(path, &text, &Settings::default()) {
            prop_assert!(!e.to_string().contains('\n'), "{}", e);
        }
    }
}
