//! Compiles the kubelet's gRPC APIs (proto/) with protox, a protobuf compiler in Rust, so the
//! build needs no protoc and no network.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/pluginregistration.proto",
        "proto/dra_v1.proto",
        "proto/dra_v1beta1.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
