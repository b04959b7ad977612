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
//! Everything downloaded is verified: the suites' `InRelease` files by `gpgv` against the host's
//! Debian archive keyring, the `Packages` index by the hash `InRelease` gives, each `.deb` by the
//! hash the index gives.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::{output, run};

const MIRROR: &str = "http://deb.debian.org/debian";
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
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

/// A suite's verified binary package index for amd64: package name -> (file name, SHA-256).
struct PackageIndex {
    suite: &'static str,
    packages: HashMap<String, (String, String)>,
}

impl PackageIndex {
    fn fetch(downloads: &Path, suite: &'static str) -> Result<Self> {
        let dist = format!("{MIRROR}/dists/{suite}");
        let signed = downloads.join(format!("{suite}-InRelease"));
        let release = downloads.join(format!("{suite}-Release"));
        download(&format!("{dist}/InRelease"), &signed)?;
        run(Command::new("gpgv")
            .args(["--quiet", "--keyring", KEYRING, "--output"])
            .arg(&release)
            .arg(&signed))
        .with_context(|| format!("{suite}'s InRelease is not signed by a Debian archive key"))?;
        let release_text = std::fs::read_to_string(&release)?;
        let index_name = "main/binary-amd64/Packages.xz";
        let index_hash = sha256_listed(&release_text, index_name)
            .with_context(|| format!("{suite}'s Release lists no SHA256 of {index_name}"))?;
        let compressed = downloads.join(format!("{suite}-Packages.xz"));
        download(&format!("{dist}/{index_name}"), &compressed)?;
        verify_sha256(&compressed, &index_hash)?;
        let text = output(Command::new("xz").arg("-dc").arg(&compressed))?;
        Ok(Self {
            suite,
            packages: parse_packages(&text),
        })
    }

    /// Downloads `package`'s .deb (unless a verified copy is there) and returns its path.
    fn download(&self, downloads: &Path, package: &str) -> Result<PathBuf> {
        let (file_name, hash) = self
            .packages
            .get(package)
            .with_context(|| format!("Debian {} has no package {package}", self.suite))?;
        let base = file_name.rsplit('/').next().unwrap_or(file_name);
        let path = downloads.join(base);
        if !(path.exists() && verify_sha256(&path, hash).is_ok()) {
            eprintln!("xtask: downloading {base}");
            download(&format!("{MIRROR}/{file_name}"), &path)?;
            verify_sha256(&path, hash)?;
        }
        Ok(path)
    }
}

/// Package name -> (Filename, SHA256) of each stanza of a `Packages` file; for a package listed
/// more than once, the last stanza.
fn parse_packages(text: &str) -> HashMap<String, (String, String)> {
    let mut packages = HashMap::new();
    for stanza in text.split("\n\n") {
        let field = |name: &str| {
            stanza
                .lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(": "))
                .map(str::to_owned)
        };
        if let (Some(package), Some(file), Some(hash)) =
            (field("Package"), field("Filename"), field("SHA256"))
        {
            packages.insert(package, (file, hash));
        }
    }
    packages
}

/// The SHA-256 a Release file gives for `name` (lines ` <hash> <size> <name>` under `SHA256:`).
fn sha256_listed(release: &str, name: &str) -> Option<String> {
    let section = release.split("\nSHA256:\n").nth(1)?;
    section
        .lines()
        .take_while(|line| line.starts_with(' '))
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            let hash = fields.next()?;
            let _size = fields.next()?;
            (fields.next()? == name).then(|| hash.to_owned())
        })
}

fn verify_sha256(path: &Path, expected: &str) -> Result<()> {
    let out = output(Command::new("sha256sum").arg(path))?;
    let actual = out.split_whitespace().next().unwrap_or_default();
    if actual != expected {
        bail!(
            "{}: SHA-256 {actual}, the signed index says {expected}",
            path.display()
        );
    }
    Ok(())
}

fn download(url: &str, to: &Path) -> Result<()> {
    run(Command::new("curl")
        .args([
            "--fail",
            "--silent",
            "--show-error",
            "--location",
            "--retry",
            "3",
            "--output",
        ])
        .arg(to)
        .arg(url))
    .with_context(|| format!("downloading {url}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_hashes_from_release_and_packages_files() {
        let release = "Origin: Debian\nMD5Sum:\n 00 1 main/binary-amd64/Packages.xz\nSHA256:\n aa 10 main/binary-amd64/Packages.gz\n bb 12 main/binary-amd64/Packages.xz\nOther: x\n";
        assert_eq!(
            sha256_listed(release, "main/binary-amd64/Packages.xz").as_deref(),
            Some("bb")
        );
        assert_eq!(sha256_listed(release, "missing"), None);
        let packages = "Package: libc6\nVersion: 2.41\nFilename: pool/main/g/glibc/libc6.deb\nSHA256: cc\n\nPackage: other\nFilename: x\n";
        let parsed = parse_packages(packages);
        assert_eq!(
            parsed.get("libc6"),
            Some(&("pool/main/g/glibc/libc6.deb".to_owned(), "cc".to_owned()))
        );
        assert!(!parsed.contains_key("other"), "no SHA256: not usable");
    }
}
