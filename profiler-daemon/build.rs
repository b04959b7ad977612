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
        // OTLP profiles (client); the files it imports are found from the include path.
        "proto/opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
    ];
    for proto in pprof.iter().chain(&services) {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=proto/opentelemetry");
    // protox is a protobuf compiler in Rust: no `protoc` needed on the build machine.
    let descriptors = protox::compile(pprof, ["proto"]).context("compiling .proto files")?;
    prost_build::Config::new()
        .compile_fds(descriptors)
        .context("generating Rust from .proto files")?;
    // The gRPC services: Pyroscope's push API and OTLP's profiles service (clients) and our live
    // stream (client and server).
    let descriptors = protox::compile(services, ["proto"]).context("compiling .proto files")?;
    tonic_prost_build::configure()
        .compile_fds(descriptors)
        .context("generating gRPC code from .proto files")?;
    Ok(())
}

/// Builds the eBPF object once per content: aya-build compiles it (and `core`) in a target
/// directory under OUT_DIR, which differs for every profile and feature set the daemon is built
/// with (debug, test, release), so a test run would build it three times. The object is kept in
/// `target/ebpf-object/<hash of its sources, the lock file, the nightly and bpf-linker>` and
/// copied from there when nothing changed.
fn build_ebpf() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let package_dir = |name: &str| -> anyhow::Result<std::path::PathBuf> {
        let package = metadata
            .packages
            .iter()
            .find(|package| package.name.as_str() == name)
            .ok_or_else(|| anyhow!("{name} package not found in the workspace"))?;
        Ok(package
            .manifest_path
            .parent()
            .ok_or_else(|| anyhow!("{name} manifest has no parent directory"))?
            .as_std_path()
            .to_path_buf())
    };
    let ebpf_dir = package_dir("profiler-ebpf")?;
    let common_dir = package_dir("profiler-common")?;
    let unwind_dir = package_dir("profiler-unwind")?;
    println!("cargo:rerun-if-changed={}", common_dir.display());
    println!("cargo:rerun-if-changed={}", unwind_dir.display());
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").context("OUT_DIR")?);
    let mut key = Fnv::default();
    for dir in [&ebpf_dir, &common_dir, &unwind_dir] {
        hash_tree(dir, &mut key)?;
    }
    let workspace = metadata.workspace_root.as_std_path();
    key.write(&std::fs::read(workspace.join("Cargo.lock")).unwrap_or_default());
    let toolchain = std::process::Command::new("rustc")
        .args(["+nightly", "-vV"])
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    key.write(&toolchain);
    let linker = std::process::Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    key.write(&linker);
    let cache_dir = metadata
        .target_directory
        .as_std_path()
        .join("ebpf-object")
        .join(format!("{:016x}", key.0));
    // Two objects from one crate: the default (kernels 6.1+) and the `compat` feature's
    // (5.10+); see profiler-ebpf/src/main.rs. aya-build leaves each as `OUT_DIR/profiler`.
    let objects = [("profiler", &[][..]), ("profiler-compat", &["compat"][..])];
    let cached = objects.map(|(name, _)| (cache_dir.join(name), out_dir.join(name)));
    if cached
        .iter()
        .all(|(from, to)| std::fs::copy(from, to).is_ok())
    {
        println!("cargo:rerun-if-changed={}", ebpf_dir.display());
        return Ok(());
    }
    let built = out_dir.join("profiler");
    for (name, features) in objects.iter().rev() {
        aya_build::build_ebpf(
            [aya_build::Package {
                name: "profiler-ebpf",
                root_dir: ebpf_dir.to_str().context("non-UTF-8 path")?,
                features,
                ..Default::default()
            }],
            aya_build::Toolchain::default(),
        )
        .context("building the eBPF program (needs the nightly toolchain with rust-src and bpf-linker: run `cargo xtask setup`)")?;
        if *name != "profiler" {
            std::fs::rename(&built, out_dir.join(name))
                .with_context(|| format!("keeping the {name} object"))?;
        }
    }
    // A cache: failing to fill it only costs a later rebuild.
    let _ = std::fs::create_dir_all(&cache_dir);
    for (to_cache, built) in &cached {
        let _ = std::fs::copy(built, to_cache);
    }
    Ok(())
}

/// FNV-1a over every file's path and bytes below `dir` (sorted; `target` directories skipped).
fn hash_tree(dir: &std::path::Path, key: &mut Fnv) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            if entry.file_name() != "target" {
                hash_tree(&path, key)?;
            }
        } else {
            key.write(path.as_os_str().as_encoded_bytes());
            key.write(&std::fs::read(&path)?);
        }
    }
    Ok(())
}

struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}
