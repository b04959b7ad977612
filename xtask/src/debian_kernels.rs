//! The kernels of the kernel matrix (tests/tests/kernel_matrix.rs): the newest Debian kernel of
//! each of Debian's last three releases, 5.10 (11), 6.1 (12) and 6.12 (13), as users' nodes run
//! them (Amazon Linux 2 and RHEL 9 are 5.10-5.14; Ubuntu, Bottlerocket, COS 5.15-6.12).
//!
//! Each is installed under `.tools/kernels/<series>/`: its `vmlinuz`, the modules a QEMU guest
//! needs to mount the host's filesystem over 9p (virtio, 9p and what they depend on),
//! decompressed, and `release` (its `uname -r`). Verified like every package (`debian_archive`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::debian_archive::PackageIndex;
use crate::run;

pub struct TestKernel {
    /// What the tests call it: the directory under `.tools/kernels/`.
    pub series: &'static str,
    pub suite: &'static str,
    /// The image package's name is `prefix`, an ABI number, `suffix` (`-cloud`, `-rt` excluded).
    pub prefix: &'static str,
    pub suffix: &'static str,
}

pub const TEST_KERNELS: &[TestKernel] = &[
    TestKernel {
        series: "5.10",
        suite: "bullseye",
        prefix: "linux-image-5.10.0-",
        suffix: "-amd64-unsigned",
    },
    TestKernel {
        series: "6.1",
        suite: "bookworm",
        prefix: "linux-image-6.1.0-",
        suffix: "-amd64-unsigned",
    },
    TestKernel {
        series: "6.12",
        suite: "trixie",
        prefix: "linux-image-6.12.",
        suffix: "+deb13-amd64-unsigned",
    },
];

/// The modules the guest loads (any it lacks are built in): the virtio PCI transport, 9p over
/// virtio, and the caching layers 9p depends on.
const GUEST_MODULES: &[&str] = &[
    "virtio",
    "virtio_ring",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "fscache",
    "netfs",
    "9pnet",
    "9pnet_virtio",
    "9p",
];

pub fn install(tools: &Path) -> Result<()> {
    let root = tools.join("kernels");
    let missing: Vec<&TestKernel> = TEST_KERNELS
        .iter()
        .filter(|kernel| !root.join(kernel.series).join(".installed").exists())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let downloads = tools.join("debian-downloads");
    std::fs::create_dir_all(&downloads)?;
    for kernel in missing {
        let index = PackageIndex::fetch(&downloads, kernel.suite)?;
        let package = index
            .newest_matching(kernel.prefix, kernel.suffix, |abi| {
                abi.chars().all(|c| c.is_ascii_digit())
            })
            .with_context(|| {
                format!(
                    "Debian {} has no {}*{} package",
                    kernel.suite, kernel.prefix, kernel.suffix
                )
            })?
            .to_owned();
        let deb = index.download(&downloads, &package)?;
        install_one(&root, kernel.series, &package, &deb)?;
    }
    Ok(())
}

/// Extracts the image and the guest's modules into `<series>.partial`, then renames it into
/// place: an interrupted install leaves nothing that looks installed.
fn install_one(root: &Path, series: &str, package: &str, deb: &Path) -> Result<()> {
    eprintln!("xtask: installing {package} for the kernel matrix");
    let dir = root.join(series);
    let partial = root.join(format!("{series}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    let extracted = partial.join("extracted");
    std::fs::create_dir_all(&extracted)?;
    let status = Command::new("sh")
        .arg("-c")
        .arg(
            "dpkg-deb --fsys-tarfile \"$0\" | tar -x -C \"$1\" --wildcards \
             './boot/vmlinuz-*' '*/kernel/fs/*' '*/kernel/net/9p/*' '*/kernel/drivers/virtio/*'",
        )
        .arg(deb)
        .arg(&extracted)
        .status()?;
    if !status.success() {
        bail!("extracting {}", deb.display());
    }
    let boot = extracted.join("boot");
    let vmlinuz = std::fs::read_dir(&boot)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .with_context(|| format!("{package} has no vmlinuz"))?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .context("vmlinuz name")?
        .to_owned();
    std::fs::rename(&vmlinuz, partial.join("vmlinuz"))?;
    let modules = partial.join("modules");
    std::fs::create_dir_all(&modules)?;
    for path in files_under(&extracted)? {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let (stem, compressed) = match name.strip_suffix(".ko.xz") {
            Some(stem) => (stem, true),
            None => match name.strip_suffix(".ko") {
                Some(stem) => (stem, false),
                None => continue,
            },
        };
        if !GUEST_MODULES.contains(&stem) {
            continue;
        }
        let to = modules.join(format!("{stem}.ko"));
        if compressed {
            let out = std::fs::File::create(&to)?;
            run(Command::new("xz").arg("-dc").arg(&path).stdout(out))?;
        } else {
            std::fs::copy(&path, &to)?;
        }
    }
    std::fs::remove_dir_all(&extracted)?;
    std::fs::write(partial.join("release"), format!("{release}\n"))?;
    std::fs::write(partial.join(".installed"), format!("{package}\n"))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&partial, &dir)?;
    Ok(())
}

fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                pending.push(entry.path());
            } else {
                files.push(entry.path());
            }
        }
    }
    Ok(files)
}
