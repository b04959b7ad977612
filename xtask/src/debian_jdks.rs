//! Test JDKs newer than this Debian release: OpenJDK 26 and 27 from Debian sid, made to run on
//! bookworm's older glibc.
//!
//! sid's JDK binaries need glibc 2.38; bookworm has 2.36, and the host's glibc is not ours to
//! change. So each JDK is extracted with trixie's `libc6` beside it under `.tools/jdkN/`, and every
//! ELF file of the JDK is patched (`patchelf`) to use that glibc: launchers get its dynamic loader
//! as their interpreter, and every executable and library gets its directory first in RUNPATH
//! (RUNPATH is not inherited by `dlopen`ed libraries such as `libjvm.so`, so each needs its own).
//! The packages' absolute symlinks into `/etc/java-N-openjdk` are re-pointed into the extracted
//! tree. These are patched copies of Debian's JDKs, not the files a user runs; the JVM inside
//! (libjvm.so, its VMStructs, its code) is Debian's, byte for byte apart from the ELF headers.
//!
//! Everything downloaded is verified (`debian_archive`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::debian_archive::PackageIndex;
use crate::{output, run};

/// The glibc the patched JDKs run on: trixie's, the oldest Debian release new enough.
const GLIBC_SUITE: &str = "trixie";
/// Where Debian's `libc6` puts the dynamic loader and libc.
const GLIBC_LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// A JDK to install from a Debian suite: its major version and suite.
pub struct DebianJdk {
    pub major: u32,
    pub suite: &'static str,
}

/// The JDKs the tests run on beyond the machine's and PyPI's.
pub const DEBIAN_JDKS: &[DebianJdk] = &[
    DebianJdk {
        major: 8,
        suite: "sid",
    },
    DebianJdk {
        major: 26,
        suite: "sid",
    },
    DebianJdk {
        major: 27,
        suite: "sid",
    },
];

/// The `java` launcher of an installed Debian JDK under `tools` (the repository's `.tools/`).
pub fn java_path(tools: &Path, major: u32) -> PathBuf {
    // JDK 8 keeps its runtime, the launcher included, under `jre/`.
    let launcher = if major == 8 {
        "jre/bin/java"
    } else {
        "bin/java"
    };
    tools
        .join(format!("jdk{major}"))
        .join(format!("usr/lib/jvm/java-{major}-openjdk-amd64/{launcher}"))
}

/// What `java -version` prints for a major: `version "1.8.0_504"` for 8, `version "26..."` later.
fn version_banner(major: u32) -> String {
    if major == 8 {
        "version \"1.8".to_owned()
    } else {
        format!("version \"{major}")
    }
}

/// Installs each of `jdks` missing under `tools`.
pub fn install(tools: &Path, jdks: &[DebianJdk]) -> Result<()> {
    let missing: Vec<&DebianJdk> = jdks
        .iter()
        .filter(|jdk| !installed_marker(tools, jdk.major).exists())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let downloads = tools.join("debian-downloads");
    std::fs::create_dir_all(&downloads)?;
    let mut indexes: HashMap<&str, PackageIndex> = HashMap::new();
    let glibc = index_of(&mut indexes, &downloads, GLIBC_SUITE)?.download(&downloads, "libc6")?;
    for jdk in missing {
        let index = index_of(&mut indexes, &downloads, jdk.suite)?;
        let debs = [
            index.download(&downloads, &format!("openjdk-{}-jre-headless", jdk.major))?,
            index.download(&downloads, &format!("openjdk-{}-jdk-headless", jdk.major))?,
            glibc.clone(),
        ];
        install_one(tools, jdk.major, &debs)?;
    }
    Ok(())
}

fn installed_marker(tools: &Path, major: u32) -> PathBuf {
    tools.join(format!("jdk{major}")).join(".installed")
}

fn index_of<'a>(
    indexes: &'a mut HashMap<&'static str, PackageIndex>,
    downloads: &Path,
    suite: &'static str,
) -> Result<&'a PackageIndex> {
    if !indexes.contains_key(suite) {
        indexes.insert(suite, PackageIndex::fetch(downloads, suite)?);
    }
    Ok(&indexes[suite])
}

/// Extracts `debs` into `.tools/jdkN.partial`, patches it, checks that `java -version` runs and
/// names the right release, then renames it into place: an interrupted install leaves nothing
/// that looks installed.
fn install_one(tools: &Path, major: u32, debs: &[PathBuf]) -> Result<()> {
    let root = tools.join(format!("jdk{major}"));
    let partial = tools.join(format!("jdk{major}.partial"));
    for stale in [&root, &partial] {
        if stale.exists() {
            std::fs::remove_dir_all(stale)?;
        }
    }
    eprintln!(
        "xtask: installing OpenJDK {major} (Debian, patched for this glibc) into {}",
        root.display()
    );
    for deb in debs {
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&partial))?;
    }
    let root_abs = std::path::absolute(&root)?;
    let jdk_dir = partial.join(format!("usr/lib/jvm/java-{major}-openjdk-amd64"));
    repoint_config_links(&jdk_dir, &format!("/etc/java-{major}-openjdk"), &root_abs)?;
    // Paths written into the ELF files are final ones (`root`), not the staging directory's.
    let glibc_dir = root_abs.join(GLIBC_LIB_DIR);
    patch_elf_files(&jdk_dir, &glibc_dir)?;
    std::fs::rename(&partial, &root)?;
    let java = java_path(tools, major);
    let version = Command::new(&java)
        .arg("-version")
        .output()
        .with_context(|| format!("running {}", java.display()))?;
    let banner = String::from_utf8_lossy(&version.stderr);
    if !version.status.success() || !banner.contains(&version_banner(major)) {
        bail!("the patched JDK {major} does not run: {banner}");
    }
    std::fs::write(installed_marker(tools, major), banner.as_bytes())?;
    Ok(())
}

/// Re-points the package's absolute symlinks into `etc_dir` (config and security files, which
/// dpkg would have installed there) at the same files under `root`.
fn repoint_config_links(dir: &Path, etc_dir: &str, root: &Path) -> Result<()> {
    for path in walk(dir)? {
        let Ok(target) = std::fs::read_link(&path) else {
            continue;
        };
        if let Ok(rest) = target.strip_prefix(etc_dir) {
            let moved = root.join(etc_dir.trim_start_matches('/')).join(rest);
            std::fs::remove_file(&path)?;
            std::os::unix::fs::symlink(moved, &path)?;
        }
    }
    Ok(())
}

/// Makes every ELF file under `dir` load `glibc_dir`'s glibc: its dynamic loader as interpreter
/// (executables that have one) and its directory first in RUNPATH (all of them).
fn patch_elf_files(dir: &Path, glibc_dir: &Path) -> Result<()> {
    let interpreter = glibc_dir.join("ld-linux-x86-64.so.2");
    let mut patched = 0;
    for path in walk(dir)? {
        let metadata = std::fs::symlink_metadata(&path)?;
        if !metadata.is_file() || !is_elf(&path)? {
            continue;
        }
        let has_interpreter = crate::succeeds(
            Command::new("patchelf")
                .arg("--print-interpreter")
                .arg(&path),
        );
        if has_interpreter {
            run(Command::new("patchelf")
                .arg("--set-interpreter")
                .arg(&interpreter)
                .arg(&path))?;
        }
        let old = output(Command::new("patchelf").arg("--print-rpath").arg(&path))?;
        let mut runpath = glibc_dir.as_os_str().to_owned();
        if !old.trim().is_empty() {
            runpath.push(":");
            runpath.push(old.trim());
        }
        run(Command::new("patchelf")
            .arg("--set-rpath")
            .arg(runpath)
            .arg(&path))?;
        patched += 1;
    }
    if patched == 0 {
        bail!("no ELF file found under {}", dir.display());
    }
    Ok(())
}

fn is_elf(path: &Path) -> Result<bool> {
    use std::io::Read as _;
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(path)?;
    Ok(file.read_exact(&mut magic).is_ok() && magic == *b"\x7fELF")
}

/// Every path under `dir` (not following symlinks).
fn walk(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                pending.push(entry.path());
            }
            paths.push(entry.path());
        }
    }
    Ok(paths)
}
