//! Build script: with the `verbs` feature, bindings to the system's librdmacm
//! (`<rdma/rdma_cma.h>`, from librdmacm-dev) for `src/hw/rdmacm/`, and the link to it. The
//! default build does nothing here.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "verbs")]
    rdmacm::generate();
}

#[cfg(feature = "verbs")]
mod rdmacm {
    use std::path::PathBuf;

    /// Writes `$OUT_DIR/rdma_cma.rs`: the `rdma_*` functions and types of `rdma_cma.h` and the
    /// `ibv_*` types they reach (their own copies: no pointer crosses into `ibverbs-sys`).
    pub(super) fn generate() {
        println!("cargo:rerun-if-changed=/usr/include/rdma/rdma_cma.h");
        println!("cargo:rerun-if-changed=/usr/include/infiniband/ib.h");
        println!("cargo:rustc-link-lib=rdmacm");
        let bindings = bindgen::Builder::default()
            .header_contents(
                "rdmacm.h",
                "#include <rdma/rdma_cma.h>\n#include <infiniband/ib.h>\n",
            )
            .allowlist_function("rdma_(create|destroy)_event_channel")
            .allowlist_function("rdma_(create|destroy)_id")
            .allowlist_function("rdma_(resolve_addr|resolve_route|bind_addr|listen)")
            .allowlist_function("rdma_(connect|accept|reject|establish|disconnect|notify)")
            .allowlist_function("rdma_(get|ack)_cm_event")
            .allowlist_function("rdma_init_qp_attr")
            .allowlist_function("rdma_event_str")
            .allowlist_var("RDMA_IB_IP_PS_TCP|RDMA_IB_PS_IB")
            .allowlist_type("rdma_cm_event_type")
            .allowlist_type("rdma_port_space")
            .allowlist_type("sockaddr_ib")
            .allowlist_type("ibv_qp_attr_mask")
            .allowlist_type("ibv_qp_state")
            .allowlist_type("ibv_mtu")
            .allowlist_type("ibv_access_flags")
            .allowlist_type("ibv_event_type")
            .prepend_enum_name(false)
            .derive_default(true)
            .size_t_is_usize(true)
            .layout_tests(true)
            .generate()
            .unwrap_or_else(|e| {
                panic!("bindgen over <rdma/rdma_cma.h> (install librdmacm-dev): {e}")
            });
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
        bindings
            .write_to_file(out.join("rdma_cma.rs"))
            .expect("writing the librdmacm bindings");
    }
}
