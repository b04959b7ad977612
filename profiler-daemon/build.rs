//! Builds the eBPF object (embedded in the daemon with `include_bytes_aligned!`) and the
//! protobuf types.
use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    build_protos()?;
    build_ebpf()
}

fn build_protos() -> anyhow::Result<()> {
    let pprof = ["proto/pprof/profile.proto"];
    let services = [
        "proto/types/v1/types.proto",
        "proto/push/v1/push.proto",
        "proto/profiler/v1/stream.proto",
    ];
    for proto in pprof.iter().chain(&services) {
        println!("cargo:rerun-if-changed={proto}");
    }
    // protox is a protobuf compiler in Rust: no `protoc` needed on the build machine.
    let descriptors = protox::compile(pprof, ["proto"]).context("compiling .proto files")?;
    prost_build::Config::new()
        .compile_fds(descriptors)
        .context("generating Rust from .proto files")?;
    // The gRPC services: Pyroscope's push API (client) and our live stream (client and server).
    let descriptors = protox::compile(services, ["proto"]).context("compiling .proto files")?;
    tonic_prost_build::configure()
        .compile_fds(descriptors)
        .context("generating gRPC code from .proto files")?;
    Ok(())
}

fn build_ebpf() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|package| package.name.as_str() == "profiler-ebpf")
        .ok_or_else(|| anyhow!("profiler-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("profiler-ebpf manifest has no parent directory"))?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: ebpf.name.as_str(),
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context("building the eBPF program (needs the nightly toolchain with rust-src and bpf-linker: run `cargo xtask setup`)")
}
