//! Packages from Debian's archive, verified: the suites' `InRelease` files by `gpgv` against the
//! host's Debian archive keyring, the `Packages` index by the hash `InRelease` gives, each `.deb`
//! by the hash the index gives. Used for the test JDKs newer than this release
//! (`debian_jdks`) and the kernels of the kernel matrix (`debian_kernels`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::{output, run};

const MIRROR: &str = "http://deb.debian.org/debian";
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// A suite's verified binary package index for amd64: package name -> (file name, SHA-256).
pub struct PackageIndex {
    suite: &'static str,
    packages: HashMap<String, (String, String)>,
}

impl PackageIndex {
    pub fn fetch(downloads: &Path, suite: &'static str) -> Result<Self> {
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

    /// The package named `prefix`, a middle `middle_ok` accepts, `suffix`, whose middle sorts
    /// last by its numbers (e.g. the newest ABI of a kernel series), if any.
    pub fn newest_matching(
        &self,
        prefix: &str,
        suffix: &str,
        middle_ok: impl Fn(&str) -> bool,
    ) -> Option<&str> {
        self.packages
            .keys()
            .filter(|name| {
                name.strip_prefix(prefix)
                    .and_then(|rest| rest.strip_suffix(suffix))
                    .is_some_and(&middle_ok)
            })
            .max_by(|a, b| natural_order(a, b))
            .map(String::as_str)
    }

    /// Downloads `package`'s .deb (unless a verified copy is there) and returns its path.
    pub fn download(&self, downloads: &Path, package: &str) -> Result<PathBuf> {
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
/// Compares names by their runs of digits as numbers ("6.1.0-9" < "6.1.0-50").
fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    let runs = |s: &str| -> Vec<(bool, String)> {
        let mut out: Vec<(bool, String)> = Vec::new();
        for c in s.chars() {
            let digit = c.is_ascii_digit();
            match out.last_mut() {
                Some((was_digit, run)) if *was_digit == digit => run.push(c),
                _ => out.push((digit, c.to_string())),
            }
        }
        out
    };
    let (a, b) = (runs(a), runs(b));
    for (x, y) in a.iter().zip(&b) {
        let order = match (x, y) {
            ((true, x), (true, y)) => x
                .parse::<u64>()
                .unwrap_or(0)
                .cmp(&y.parse::<u64>().unwrap_or(0)),
            ((_, x), (_, y)) => x.cmp(y),
        };
        if order.is_ne() {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

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

    #[test]
    fn the_newest_kernel_abi_is_chosen_by_number() {
        let index = PackageIndex {
            suite: "bookworm",
            packages: ["9", "47", "50", "50-cloud"]
                .iter()
                .map(|abi| {
                    (
                        format!("linux-image-6.1.0-{abi}-amd64-unsigned"),
                        (String::new(), String::new()),
                    )
                })
                .collect(),
        };
        assert_eq!(
            index.newest_matching("linux-image-6.1.0-", "-amd64-unsigned", |abi| abi
                .chars()
                .all(|c| c.is_ascii_digit())),
            Some("linux-image-6.1.0-50-amd64-unsigned")
        );
    }
}
