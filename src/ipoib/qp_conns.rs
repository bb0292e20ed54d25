//! The connections of one direction by QP number: the map the RX and TX tables are built on.
//!
//! A table derefs to its [`QpConns`] for reading; only the table itself holds it mutably, so
//! the table's own invariants (the TX peer index, the RX drain bookkeeping) stay with it.

use crate::verbs::QpNum;
use crate::wire::IdMap;

/// Connections keyed by their QP number.
#[derive(Debug)]
pub(in crate::ipoib) struct QpConns<C>(IdMap<QpNum, C>);

impl<C> Default for QpConns<C> {
    fn default() -> Self {
        Self(IdMap::default())
    }
}

impl<C> QpConns<C> {
    pub(in crate::ipoib) fn get(&self, qpn: &QpNum) -> Option<&C> {
        self.0.get(qpn)
    }

    pub(in crate::ipoib) fn get_mut(&mut self, qpn: &QpNum) -> Option<&mut C> {
        self.0.get_mut(qpn)
    }

    pub(in crate::ipoib) fn contains(&self, qpn: &QpNum) -> bool {
        self.0.contains_key(qpn)
    }

    pub(in crate::ipoib) fn len(&self) -> usize {
        self.0.len()
    }

    pub(in crate::ipoib) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(in crate::ipoib) fn iter(&self) -> impl Iterator<Item = (&QpNum, &C)> {
        self.0.iter()
    }

    pub(in crate::ipoib) fn values(&self) -> impl Iterator<Item = &C> {
        self.0.values()
    }

    pub(in crate::ipoib) fn values_mut(&mut self) -> impl Iterator<Item = &mut C> {
        self.0.values_mut()
    }

    pub(in crate::ipoib) fn iter_mut(&mut self) -> impl Iterator<Item = (&QpNum, &mut C)> {
        self.0.iter_mut()
    }

    /// The QP numbers of every connection, in no particular order.
    pub(in crate::ipoib) fn qpns(&self) -> Vec<QpNum> {
        self.0.keys().copied().collect()
    }

    pub(in crate::ipoib) fn insert(&mut self, qpn: QpNum, conn: C) {
        self.0.insert(qpn, conn);
    }

    pub(in crate::ipoib) fn remove(&mut self, qpn: &QpNum) -> Option<C> {
        self.0.remove(qpn)
    }
}
