//! The generated bindings to `<rdma/rdma_cma.h>` (`build.rs`): the librdmacm calls this
//! wrapper makes and the C types they reach, including their own copies of the `ibv_*`
//! structs (`ibv_qp_attr` for `rdma_init_qp_attr`), so that no pointer crosses into
//! `ibverbs-sys`.
#![allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    missing_docs,
    unreachable_pub,
    unused_qualifications,
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks,
    clippy::use_self
)]

include!(concat!(env!("OUT_DIR"), "/rdma_cma.rs"));
