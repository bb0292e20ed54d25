//! Device events the endpoint hands to the driver: a lost context stops it, a GID change and
//! a port become active are passed on.

use std::time::Instant;

use super::*;
use crate::soft::{SoftConfig, SoftVerbs};
use crate::verbs::AsyncEvent;

fn setup() -> (SoftVerbs, Endpoint) {
    let mut v = SoftVerbs::new(SoftConfig::new("198.18.0.1".parse().unwrap()));
    let cfg = EndpointConfig::new(vec![("198.19.0.1".parse().unwrap(), 24)]);
    let ep = Endpoint::new(Instant::now(), &mut v, cfg, None).unwrap();
    (v, ep)
}

#[test]
fn a_lost_context_stops_the_endpoint_and_is_handed_to_the_driver_once() {
    let (mut v, mut ep) = setup();
    let now = Instant::now();
    ep.handle_verbs(now, &mut v);
    assert!(!ep.context_lost());
    assert_eq!(ep.take_device_event(), None);
    v.fail_device();
    ep.handle_verbs(now, &mut v);
    assert!(ep.context_lost());
    assert_eq!(ep.take_device_event(), Some(AsyncEvent::DeviceFatal));
    assert_eq!(ep.take_device_event(), None);
    // Nothing more is read from the dead device.
    v.raise_port_event(AsyncEvent::PortActive);
    ep.handle_verbs(now, &mut v);
    assert_eq!(ep.take_device_event(), None);
}

#[test]
fn a_gid_change_is_handed_to_the_driver_and_the_endpoint_goes_on() {
    let (mut v, mut ep) = setup();
    v.raise_port_event(AsyncEvent::GidChange);
    ep.handle_verbs(Instant::now(), &mut v);
    assert!(!ep.context_lost());
    assert_eq!(ep.take_device_event(), Some(AsyncEvent::GidChange));
    assert_eq!(ep.take_device_event(), None);
}

/// A port that became active is handed to the driver, which reads its MTU again (an SM, or
/// rxe's netdev, may have changed it while it was down).
#[test]
fn a_port_active_is_handed_to_the_driver() {
    let (mut v, mut ep) = setup();
    v.raise_port_event(AsyncEvent::PortActive);
    ep.handle_verbs(Instant::now(), &mut v);
    assert!(!ep.context_lost());
    assert_eq!(ep.take_device_event(), Some(AsyncEvent::PortActive));
    assert_eq!(ep.take_device_event(), None);
}
