//! Tests of the endpoint over the simulated fabric.
