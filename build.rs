//! Compiles etcd's v3 wire API from `proto/` with protox (pure Rust: no system `protoc`)
//! and generates tonic clients (and, for the simulated cluster of the `simulation` feature,
//! servers) with tonic-prost-build. The generated code stays private
//! to the crate (see `src/transport/generated.rs`). Only the KV, Lease, Watch, Auth and
//! Maintenance services are used: the server-side Lock and Election services are not
//! (the recipes are built on transactions, as in Go's `concurrency`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/kv.proto", "proto/rpc.proto"];
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        // The servers only for the simulated cluster (feature `simulation`), with every
        // method it does not serve answering "unimplemented".
        .build_server(true)
        .server_mod_attribute("etcdserverpb", "#[cfg(feature = \"simulation\")]")
        .generate_default_stubs(true)
        .compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
