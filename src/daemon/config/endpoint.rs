//! What the endpoint and the provider take from a resolved [`Config`].

use std::fmt;

use super::settings::Config;
use super::types::path_mtu_for_link_mtu;
use crate::ipoib::EndpointConfig;
use crate::verbs::{Gid, PathMtu, PortAttr};

/// Which bound set the path MTU ([`PathMtuChoice::source`]): the smallest of them, naming
/// `--path-mtu` first, then the underlay, then the port where two are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathMtuSource {
    /// `--path-mtu`, the operator's cap.
    Configured,
    /// What the `--bind` link carries on RoCE (its MTU less the RoCEv2 headers).
    Underlay,
    /// The port's active MTU (`ibv_query_port`; on the software provider what its underlay
    /// carries).
    Port,
}

/// The path MTU of an interface and the bounds it came from; see [`Config::path_mtu_choice`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathMtuChoice {
    /// The path MTU: connections (before their PathRecord lowers it) and UD sends.
    pub path_mtu: PathMtu,
    /// Which bound set it.
    pub source: PathMtuSource,
    /// The port's active MTU.
    pub port_active: PathMtu,
    /// The port's largest MTU: what the UD receive buffers hold (after the GRH).
    pub port_max: PathMtu,
    /// The `--bind` link's MTU, where it bounds the path (RoCE).
    pub underlay_link_mtu: Option<u32>,
    /// `--path-mtu`, if given.
    pub configured: Option<PathMtu>,
}

impl fmt::Display for PathMtuChoice {
    /// Where the path MTU came from, as the start-up line and the status say it:
    /// `port active_mtu 4096`, `--bind link mtu 1500`, `--path-mtu 2048`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.source, self.underlay_link_mtu, self.configured) {
            (PathMtuSource::Configured, _, Some(c)) => write!(f, "--path-mtu {}", c.bytes()),
            (PathMtuSource::Underlay, Some(l), _) => write!(f, "--bind link mtu {l}"),
            _ => write!(f, "port active_mtu {}", self.port_active.bytes()),
        }
    }
}

impl PathMtuChoice {
    /// The path MTU: the smallest of the port's active MTU, `underlay_link_mtu` (the `--bind`
    /// link's MTU on RoCE; `None` on InfiniBand, whose port is its own link) less the RoCEv2
    /// headers, and `configured` (`--path-mtu`, a cap that never raises it).
    pub fn new(
        port: &PortAttr,
        underlay_link_mtu: Option<u32>,
        configured: Option<PathMtu>,
    ) -> Self {
        let underlay = underlay_link_mtu.map(path_mtu_for_link_mtu);
        let bounds = [
            (PathMtuSource::Configured, configured),
            (PathMtuSource::Underlay, underlay),
            (PathMtuSource::Port, Some(port.active_mtu)),
        ];
        let path_mtu = bounds
            .iter()
            .filter_map(|&(_, m)| m)
            .min()
            .unwrap_or(port.active_mtu);
        let source = bounds
            .iter()
            .find(|&&(_, m)| m == Some(path_mtu))
            .map_or(PathMtuSource::Port, |&(s, _)| s);
        Self {
            path_mtu,
            source,
            port_active: port.active_mtu,
            port_max: port.max_mtu.max(port.active_mtu),
            underlay_link_mtu,
            configured,
        }
    }
}

impl Config {
    /// The path MTU on a port with attributes `port`: [`PathMtuChoice::new`] with
    /// `--path-mtu` as the cap.
    pub fn path_mtu_choice(
        &self,
        port: &PortAttr,
        underlay_link_mtu: Option<u32>,
    ) -> PathMtuChoice {
        PathMtuChoice::new(port, underlay_link_mtu, self.path_mtu)
    }

    /// The endpoint's settings from these: `path_mtu` as [`Config::path_mtu_choice`] gave
    /// it, `seed` for PSNs and CM ids; the rest as [`EndpointConfig::new`] sets them.
    pub fn endpoint_config(&self, path_mtu: PathMtu, seed: u64) -> EndpointConfig {
        EndpointConfig {
            mode: self.mode,
            srq: self.srq,
            rx_timeout: self.rx_timeout,
            drain_timeout: self.drain_timeout,
            tx_stall_timeout: self.tx_stall_timeout,
            neigh_timeout: self.neigh_timeout,
            neigh_max: self.neigh_max as usize,
            max_conn_qp: self.max_conn_qp as usize,
            budget_policy: self.qp_budget_policy,
            max_pending_rx: self.max_pending_rx as usize,
            tx_queue_len: self.tx_queue_len as usize,
            static_neighbours: self.neigh.clone(),
            ud_source_check: self.ud_source_check,
            peers: self.peer.iter().map(|p| Gid::from_ip(*p)).collect(),
            pin_peer_neighbours: self.pin_peer_neighbours,
            qp_timeout: self.qp_timeout,
            srq_depth: self.srq_depth,
            rx_spare: self.rx_spare,
            tx_rnr_retry: self.tx_rnr_retry,
            tx_retry_count: self.tx_retry_count,
            path_mtu,
            pkey: self.pkey,
            rdma_cm_port: self.rdma_cm_port,
            seed,
            ..EndpointConfig::new(self.addr.iter().map(|c| (c.addr, c.prefix_len)).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::Gid;

    fn port(active: PathMtu, max: PathMtu) -> PortAttr {
        PortAttr {
            gid: Gid([0; 16]),
            active_mtu: active,
            max_mtu: max,
            max_msg_size: 1 << 31,
            active: true,
            lids: None,
        }
    }

    #[test]
    fn the_path_mtu_is_the_smallest_of_the_port_the_underlay_and_the_cap() {
        use PathMtu::{Mtu1024, Mtu2048, Mtu4096};
        use PathMtuSource::{Configured, Port, Underlay};
        let ib4k = port(Mtu4096, Mtu4096);
        let cases = [
            // InfiniBand: the port alone, whatever the --bind link (not passed).
            (ib4k, None, None, Mtu4096, Port, "port active_mtu 4096"),
            (
                port(Mtu2048, Mtu4096),
                None,
                None,
                Mtu2048,
                Port,
                "port active_mtu 2048",
            ),
            // A cap lowers it, never raises it.
            (
                ib4k,
                None,
                Some(Mtu2048),
                Mtu2048,
                Configured,
                "--path-mtu 2048",
            ),
            (
                port(Mtu1024, Mtu4096),
                None,
                Some(Mtu4096),
                Mtu1024,
                Port,
                "port active_mtu 1024",
            ),
            // RoCE: the --bind link bounds it (1500 carries 1024, 9000 carries 4096).
            (
                ib4k,
                Some(1500),
                None,
                Mtu1024,
                Underlay,
                "--bind link mtu 1500",
            ),
            (
                ib4k,
                Some(9000),
                None,
                Mtu4096,
                Underlay,
                "--bind link mtu 9000",
            ),
            (
                port(Mtu2048, Mtu4096),
                Some(9000),
                None,
                Mtu2048,
                Port,
                "port active_mtu 2048",
            ),
            (
                ib4k,
                Some(9000),
                Some(Mtu1024),
                Mtu1024,
                Configured,
                "--path-mtu 1024",
            ),
            (
                ib4k,
                Some(1500),
                Some(Mtu4096),
                Mtu1024,
                Underlay,
                "--bind link mtu 1500",
            ),
        ];
        for (p, link, cap, mtu, source, said) in cases {
            let c = PathMtuChoice::new(&p, link, cap);
            assert_eq!(
                (c.path_mtu, c.source),
                (mtu, source),
                "{p:?} {link:?} {cap:?}"
            );
            assert_eq!(c.to_string(), said);
            // The UD receive buffers follow the port's largest MTU, not the path's.
            assert_eq!(c.port_max, Mtu4096);
        }
    }
}
