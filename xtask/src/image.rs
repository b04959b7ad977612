//! `cargo xtask image`: the daemon's container image, built from this repository's artifacts.
//!
//! No base image registry is reachable from the machines this project builds on, so the image
//! starts `FROM scratch` and gets a root filesystem assembled here: the daemon, the shared
//! libraries it links (as `ldd` lists them, with the dynamic loader), the JVMTI sidecar agent,
//! CA certificates and the default config. podman (Debian's) builds it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

/// The tag the image gets (and that deploy/kubernetes refers to).
pub const IMAGE: &str = "localhost/jvm-profiler:latest";
/// The JVMTI sidecar agent's file name, beside the daemon in builds and in the image.
pub const AGENT: &str = "libprofiler_jvmti.so";

#[derive(clap::Args)]
pub struct ImageArgs {
    /// Put this daemon binary in the image instead of building a release one.
    #[arg(long)]
    pub daemon: Option<PathBuf>,
}

/// Assembles `target/image/` (Containerfile + rootfs) around `daemon` and builds the image.
pub fn build(root: &Path, daemon: &Path) -> Result<()> {
    ensure_podman()?;
    let context = root.join("target/image");
    if context.exists() {
        std::fs::remove_dir_all(&context)
            .with_context(|| format!("removing {}", context.display()))?;
    }
    let rootfs = context.join("rootfs");
    assemble_rootfs(root, daemon, &rootfs)?;
    std::fs::copy(
        root.join("deploy/image/Containerfile"),
        context.join("Containerfile"),
    )?;
    let previous = image_id();
    eprintln!("xtask: building {IMAGE} with podman");
    crate::run(
        Command::new("podman")
            // One image, no intermediate ones per Containerfile step to clean up later.
            .args(["build", "--layers=false", "--tag", IMAGE, "--file"])
            .arg(context.join("Containerfile"))
            .arg(&context),
    )?;
    // The image the tag pointed at before is left untagged: remove it, so that rebuilds (every
    // test run makes one) do not pile up in podman's storage.
    if let Some(previous) = previous.filter(|id| Some(id) != image_id().as_ref()) {
        let _ = Command::new("podman")
            .args(["image", "rm", &previous])
            .output();
    }
    let size = crate::output(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{.Size}}",
        IMAGE,
    ]))?;
    let bytes: u64 = size.trim().parse().unwrap_or(0);
    eprintln!("xtask: built {IMAGE}: {:.1} MB", bytes as f64 / 1_000_000.0);
    Ok(())
}

/// The id the tag points at, if the image exists.
fn image_id() -> Option<String> {
    crate::output(Command::new("podman").args(["image", "inspect", "--format", "{{.Id}}", IMAGE]))
        .ok()
        .map(|id| id.trim().to_owned())
}

fn ensure_podman() -> Result<()> {
    let have = Command::new("podman")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have {
        eprintln!("xtask: installing podman");
        crate::apt_install(&["podman"])?;
    }
    Ok(())
}

fn assemble_rootfs(root: &Path, daemon: &Path, rootfs: &Path) -> Result<()> {
    let bin = rootfs.join("usr/local/bin");
    std::fs::create_dir_all(&bin)?;
    copy_stripped(daemon, &bin.join("profiler-daemon"))?;
    // The JVMTI sidecar agent goes beside the daemon, where `attach` looks for it by default; the
    // daemon copies it into each JVM's container when it attaches.
    let agent = daemon.with_file_name(AGENT);
    if !agent.exists() {
        bail!(
            "no {} beside the daemon: build it with `cargo build --package profiler-jvmti` (same profile)",
            agent.display()
        );
    }
    copy_stripped(&agent, &bin.join(AGENT))?;
    for library in shared_libraries(daemon)? {
        copy_to_rootfs(&library, rootfs)?;
    }
    let config_dir = rootfs.join("etc/jvm-profiler");
    std::fs::create_dir_all(&config_dir)?;
    std::fs::copy(
        root.join("deploy/config.toml"),
        config_dir.join("config.toml"),
    )?;
    // HTTPS export (Grafana Cloud) verifies the server against the system's CA bundle.
    let ca_bundle = Path::new("/etc/ssl/certs/ca-certificates.crt");
    if ca_bundle.exists() {
        copy_to_rootfs(ca_bundle, rootfs)?;
    } else {
        eprintln!(
            "xtask: warning: no {}; HTTPS export will only trust a configured ca_file",
            ca_bundle.display()
        );
    }
    std::fs::create_dir_all(rootfs.join("var/lib/jvm-profiler/profiles"))?;
    let tmp = rootfs.join("tmp");
    std::fs::create_dir_all(&tmp)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// Copies `binary` without its debug sections (the release build keeps line tables for its
/// own backtraces: 80 MB that the image does not need). Falls back to a plain copy without
/// binutils.
pub fn copy_stripped(binary: &Path, to: &Path) -> Result<()> {
    let stripped = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(to)
        .arg(binary)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !stripped {
        eprintln!(
            "xtask: warning: `strip` failed; copying {} as is",
            binary.display()
        );
        std::fs::copy(binary, to)
            .with_context(|| format!("copying {} to {}", binary.display(), to.display()))?;
    }
    Ok(())
}

/// The absolute paths `ldd` prints: every library the binary loads, and the dynamic loader.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>> {
    let listing = crate::output(Command::new("ldd").arg(binary))?;
    if listing.contains("not found") {
        bail!("`ldd {}` misses libraries:\n{listing}", binary.display());
    }
    let libraries: Vec<PathBuf> = listing.lines().filter_map(library_path).collect();
    if !libraries
        .iter()
        .any(|l| l.to_string_lossy().contains("ld-linux"))
    {
        bail!(
            "no dynamic loader in `ldd {}`:\n{listing}",
            binary.display()
        );
    }
    Ok(libraries)
}

/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or `/lib64/ld-linux-x86-64.so.2
/// (0x...)`; the vDSO has no file.
fn library_path(line: &str) -> Option<PathBuf> {
    let path = match line.split_once("=>") {
        Some((_, right)) => right.split_whitespace().next()?,
        None => line.split_whitespace().next()?,
    };
    path.starts_with('/').then(|| PathBuf::from(path))
}

/// Copies a host file to the same path under `rootfs`, following symlinks (the loader finds
/// libraries by these names).
fn copy_to_rootfs(file: &Path, rootfs: &Path) -> Result<()> {
    let target = rootfs.join(file.strip_prefix("/").unwrap_or(file));
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(file, &target)
        .with_context(|| format!("copying {} into the image", file.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ldd_lines() {
        assert_eq!(
            library_path("\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)"),
            Some(PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"))
        );
        assert_eq!(
            library_path("\t/lib64/ld-linux-x86-64.so.2 (0x00007f)"),
            Some(PathBuf::from("/lib64/ld-linux-x86-64.so.2"))
        );
        assert_eq!(library_path("\tlinux-vdso.so.1 (0x00007ffd)"), None);
        assert_eq!(library_path("\tlibfoo.so => not found"), None);
    }
}
