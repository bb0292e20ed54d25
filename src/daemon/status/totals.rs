//! The top of the status document: its schema version, the daemon's version and uptime, and
//! the interface totals that add every layer (TUN device, endpoint, CM, MAD transport,
//! provider), each packet counted once, with the counters they add kept beside them.
//!
//! - `rx_packets`/`rx_bytes`: IP packets (and their bytes) written to the TUN device, i.e.
//!   delivered to the host.
//! - `rx_dropped`: every datagram or message that arrived and was not delivered, whatever the
//!   layer that refused it ([`RX_DROPPED`]); the hostile and the merely unwanted alike.
//! - `rx_errors`: of `rx_dropped`, what arrived damaged: a bad ICRC, not parseable
//!   ([`RX_ERRORS`]); a part of `rx_dropped`, not beside it.
//! - `tx_packets`/`tx_bytes`: IP packets (and their bytes) posted for sending, RC or UD.
//! - `tx_dropped`: IP packets read from the TUN device and not sent: no neighbour answered,
//!   its queue was full, the connection failed with them queued, no send buffer ([`TX_DROPPED`]).
//! - `tx_errors`: datagrams the underlay socket refused to send ([`TX_ERRORS`]); RC sends
//!   among them are retransmitted, so they are not in `tx_dropped`. On the verbs provider,
//!   sends that completed in an error (retries exhausted, a remote NAK): posted, so in
//!   `tx_packets`, and not delivered.
//!
//! The verbs provider's device drops what is not for one of our QPs (bad ICRC, unknown QPN)
//! in hardware, where no counter of ours sees it; what it hands us as a receive completed in
//! an error (`hw_recv_errors`, a message too long for its buffer) is in `rx_dropped` and
//! `rx_errors`. Flushed work requests (a QP moved to the error state) are no packets of their
//! own and in no total: `hw_completion_errors` counts them with the rest.
//!
//! The kernel's counters of the TUN device (`ip -s link`) cannot tell the same story: a TUN
//! device counts as transmitted every packet it hands to the daemon, and has no way for the
//! daemon to report that it dropped one later; its `tx_dropped` moves only when the daemon
//! does not read fast enough. These totals are the daemon's view of the same interface.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Counters;

/// Version of the status document's layout: raised when a key changes meaning or goes away
/// (keys are only ever added within one version).
pub const SCHEMA: u32 = 2;

/// What `rx_dropped` adds, by the name each has in the document (`counters` or `provider`).
pub const RX_DROPPED: &[&str] = &[
    // Software provider: datagrams that are not RoCEv2 for one of our QPs.
    "rx_malformed",
    "rx_bad_icrc",
    "rx_bad_tver",
    "rx_bad_pkey",
    "rx_unknown_qpn",
    "rx_bad_src",
    "rx_bad_qkey",
    "rx_bad_state",
    "rx_ud_dropped",
    // Verbs provider: receives that completed in an error (not a flush).
    "hw_recv_errors",
    // MAD transport: not a whole MAD.
    "mad_recv_malformed",
    // CM: MADs it had no use for.
    "cm_dropped_malformed",
    "cm_dropped_unknown",
    "cm_dropped_spoofed",
    "cm_dropped_unexpected",
    // Endpoint: malformed or not for us, IP over UD from a source not its sender's, ARP/ND
    // conflicts, unvouched or unsolicited, packets on a closing connection.
    "rx_bad_packets",
    "rx_ud_spoofed_drops",
    "rx_ud_unbound_drops",
    "rx_ud_unknown_sender_drops",
    "neigh_conflicts",
    "neigh_unvouched_drops",
    "neigh_unsolicited_drops",
    "rx_closing_drops",
    "rx_buffer_drops",
    // TUN device: refused the write.
    "tun_write_drops",
];

/// What `rx_errors` adds (each also in [`RX_DROPPED`]).
pub const RX_ERRORS: &[&str] = &[
    "rx_malformed",
    "rx_bad_icrc",
    "rx_bad_tver",
    "hw_recv_errors",
    "mad_recv_malformed",
    "cm_dropped_malformed",
];

/// What `tx_dropped` adds.
pub const TX_DROPPED: &[&str] = &["tx_dropped", "tx_queue_drops"];

/// What `tx_errors` adds: sends the underlay socket refused (software provider), sends that
/// completed in an error other than a flush (verbs provider).
pub const TX_ERRORS: &[&str] = &["send_errors", "hw_send_errors"];

/// The interface totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Totals {
    /// IP packets delivered to the host.
    pub rx_packets: u64,
    /// Their bytes.
    pub rx_bytes: u64,
    /// Arrivals not delivered, every layer's, each once.
    pub rx_dropped: u64,
    /// Of `rx_dropped`, what arrived damaged.
    pub rx_errors: u64,
    /// IP packets sent.
    pub tx_packets: u64,
    /// Their bytes.
    pub tx_bytes: u64,
    /// IP packets from the host not sent.
    pub tx_dropped: u64,
    /// Sends the underlay refused.
    pub tx_errors: u64,
}

impl Totals {
    /// `(name, value)` in document order.
    pub fn fields(&self) -> [(&'static str, u64); 8] {
        [
            ("rx_packets", self.rx_packets),
            ("rx_bytes", self.rx_bytes),
            ("rx_dropped", self.rx_dropped),
            ("rx_errors", self.rx_errors),
            ("tx_packets", self.tx_packets),
            ("tx_bytes", self.tx_bytes),
            ("tx_dropped", self.tx_dropped),
            ("tx_errors", self.tx_errors),
        ]
    }
}

/// The counters that `rx_dropped` and `tx_dropped` add, by name (those the document has).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DropReasons {
    /// Of `rx_dropped`.
    pub rx: BTreeMap<String, u64>,
    /// Of `tx_dropped`.
    pub tx: BTreeMap<String, u64>,
}

/// The top of the document.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    /// [`SCHEMA`] of the daemon that wrote it (0: one from before the schema had a number).
    pub schema: u32,
    /// The daemon's version.
    pub version: String,
    /// Seconds since the daemon started.
    pub uptime_s: u64,
    /// The totals.
    #[serde(flatten)]
    pub totals: Totals,
    /// What the drop totals add.
    pub drops: DropReasons,
}

impl Summary {
    /// The summary of a daemon up `uptime_s` whose document has `counters` and `provider`.
    pub fn new(uptime_s: u64, counters: &Counters, provider: &BTreeMap<String, u64>) -> Self {
        let fields = counters.fields();
        let get = |name: &str| -> Option<u64> {
            fields
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| *v)
                .or_else(|| provider.get(name).copied())
        };
        let pick = |names: &[&str]| -> BTreeMap<String, u64> {
            names
                .iter()
                .filter_map(|n| get(n).map(|v| ((*n).to_owned(), v)))
                .collect()
        };
        let sum = |names: &[&str]| -> u64 { names.iter().filter_map(|n| get(n)).sum() };
        let drops = DropReasons {
            rx: pick(RX_DROPPED),
            tx: pick(TX_DROPPED),
        };
        let totals = Totals {
            rx_packets: get("tun_written").unwrap_or(0),
            rx_bytes: get("tun_written_bytes").unwrap_or(0),
            rx_dropped: drops.rx.values().sum(),
            rx_errors: sum(RX_ERRORS),
            tx_packets: get("tx_ip_packets").unwrap_or(0),
            tx_bytes: get("tx_ip_bytes").unwrap_or(0),
            tx_dropped: drops.tx.values().sum(),
            tx_errors: sum(TX_ERRORS),
        };
        Self {
            schema: SCHEMA,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_s,
            totals,
            drops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_total_adds_its_layers_once() {
        let counters = Counters {
            tx_queue_drops: 2,
            rx_bad_packets: 1,
            ..Counters::default()
        };
        let provider: BTreeMap<String, u64> = [
            ("tx_dropped", 3),
            ("neigh_failed", 1),
            ("rx_bad_icrc", 4),
            ("rx_malformed", 5),
            ("cm_dropped_unknown", 64),
            ("cm_unknown_dreq_answered", 60),
            ("neigh_conflicts", 1),
            ("tun_write_drops", 2),
            ("tun_written", 10),
            ("tun_written_bytes", 840),
            ("tx_ip_packets", 12),
            ("tx_ip_bytes", 1008),
            ("rx_duplicate", 9),
            ("send_errors", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let s = Summary::new(7, &counters, &provider);
        assert_eq!(
            s.totals,
            Totals {
                rx_packets: 10,
                rx_bytes: 840,
                // 1 + 4 + 5 + 64 + 1 + 2: not the DREQs answered (a part of the 64), not the
                // duplicates (retransmissions of what arrived).
                rx_dropped: 77,
                rx_errors: 9,
                tx_packets: 12,
                tx_bytes: 1008,
                // Five pings to nowhere: two over the queue, three given up with the neighbour.
                tx_dropped: 5,
                tx_errors: 1,
            }
        );
        assert_eq!(s.drops.tx.get("tx_queue_drops"), Some(&2));
        assert_eq!(s.drops.rx.get("rx_bad_packets"), Some(&1));
        assert_eq!(s.drops.rx.values().sum::<u64>(), s.totals.rx_dropped);
        assert_eq!((s.schema, s.uptime_s), (SCHEMA, 7));
        assert_eq!(s.version, env!("CARGO_PKG_VERSION"));
    }

    /// The verbs provider's counters: its receive and send errors in the totals, once each;
    /// its flushes (in `hw_completion_errors`) and async events in none.
    #[test]
    fn the_verbs_providers_errors_are_in_the_totals_once() {
        let provider: BTreeMap<String, u64> = [
            ("hw_completions", 100),
            ("hw_completion_errors", 20),
            ("hw_recv_errors", 3),
            ("hw_send_errors", 4),
            ("hw_async_events", 5),
            ("hw_async_unhandled", 1),
            ("tx_ip_packets", 90),
            ("tx_dropped", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let counters = Counters {
            rx_bad_packets: 2,
            ..Counters::default()
        };
        let s = Summary::new(1, &counters, &provider);
        assert_eq!(
            s.totals,
            Totals {
                rx_dropped: 3 + 2,
                rx_errors: 3,
                tx_packets: 90,
                tx_dropped: 1,
                tx_errors: 4,
                ..Totals::default()
            }
        );
        assert_eq!(s.drops.rx.get("hw_recv_errors"), Some(&3));
        assert_eq!(s.drops.rx.values().sum::<u64>(), s.totals.rx_dropped);
    }

    #[test]
    fn the_totals_are_top_level_keys() {
        let s = Summary::new(1, &Counters::default(), &BTreeMap::new());
        let v = serde_json::to_value(&s).unwrap_or_default();
        for (name, _) in s.totals.fields() {
            assert!(v.get(name).is_some(), "{name}: {v}");
        }
        for name in ["schema", "version", "uptime_s", "drops"] {
            assert!(v.get(name).is_some(), "{name}: {v}");
        }
        let back: Summary = serde_json::from_value(v).unwrap_or_default();
        assert_eq!(back, s);
    }
}
