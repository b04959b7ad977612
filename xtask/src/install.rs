//! `cargo xtask install`: the daemon as a systemd service on this host (binary and its sidecar
//! agent in /usr/local/bin, unit in /etc/systemd/system, default config in /etc/jvm-profiler).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result};

#[derive(clap::Args)]
pub struct InstallArgs {
    /// Install under this directory instead of / (staging, packaging, tests); systemd is not
    /// told.
    #[arg(long)]
    pub destdir: Option<PathBuf>,
    /// Install this daemon binary instead of building a release one.
    #[arg(long)]
    pub daemon: Option<PathBuf>,
}

const BINARY: &str = "usr/local/bin/profiler-daemon";
const UNIT: &str = "etc/systemd/system/jvm-profiler.service";
const CONFIG: &str = "etc/jvm-profiler/config.toml";

pub fn install(root: &Path, daemon: &Path, destdir: Option<&Path>) -> Result<()> {
    let dest = destdir.unwrap_or(Path::new("/"));

    // Staged then renamed: a running daemon's binary cannot be overwritten in place (ETXTBSY).
    let binary = dest.join(BINARY);
    let staged = binary.with_extension("new");
    create_parent(&binary)?;
    crate::image::copy_stripped(daemon, &staged)?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&staged, &binary)
        .with_context(|| format!("installing {}", binary.display()))?;
    eprintln!("xtask: installed {}", binary.display());

    // The sidecar agent goes beside the binary, where `attach = "auto"` looks for it.
    let agent = daemon.with_file_name(crate::image::AGENT);
    if agent.exists() {
        let installed = binary.with_file_name(crate::image::AGENT);
        let staged = installed.with_extension("new");
        crate::image::copy_stripped(&agent, &staged)?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&staged, &installed)
            .with_context(|| format!("installing {}", installed.display()))?;
        eprintln!("xtask: installed {}", installed.display());
    } else {
        eprintln!(
            "xtask: no {} beside the daemon: `attach = \"auto\"` will not find the sidecar agent \
             (build it with `cargo build --release --package profiler-jvmti`)",
            agent.display()
        );
    }

    let unit = dest.join(UNIT);
    install_file(&root.join("deploy/systemd/jvm-profiler.service"), &unit)?;

    // The config is the user's once installed: never overwritten.
    let config = dest.join(CONFIG);
    if config.exists() {
        eprintln!("xtask: kept the existing {}", config.display());
    } else {
        install_file(&root.join("deploy/config.toml"), &config)?;
    }

    // Where systemd is not the init system (a container, a VM without it), say what is left.
    let systemd_runs = Path::new("/run/systemd/system").exists();
    if destdir.is_none() && systemd_runs {
        crate::run(Command::new("systemctl").arg("daemon-reload"))?;
        eprintln!(
            "xtask: start it with `systemctl enable --now jvm-profiler` \
             (or `systemctl restart jvm-profiler` if it runs); logs: `journalctl -u jvm-profiler`"
        );
    } else {
        eprintln!(
            "xtask: systemd was not told (it is {}): on the target host run \
             `systemctl daemon-reload && systemctl enable --now jvm-profiler`",
            if destdir.is_some() {
                "a --destdir install"
            } else {
                "not PID 1 here"
            }
        );
    }
    Ok(())
}

fn create_parent(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {} (as root?)", parent.display()))?;
    }
    Ok(())
}

fn install_file(from: &Path, to: &Path) -> Result<()> {
    create_parent(to)?;
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o644))?;
    eprintln!("xtask: installed {}", to.display());
    Ok(())
}
