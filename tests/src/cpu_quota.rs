//! A CPU cgroup of a test's own that holds its members to a share of one core, as the systemd
//! unit's `CPUQuota=` does: cgroup v2's `cpu.max` where the CPU controller is there, else v1's
//! `cpu.cfs_quota_us` (this machine's Debian mounts v1's hierarchies).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

const PERIOD_US: u64 = 100_000;

pub struct CpuQuota {
    dir: PathBuf,
}

impl CpuQuota {
    /// A new cgroup `name` (made unique with our pid) whose members together get `percent` of
    /// one core.
    pub fn create(name: &str, percent: u64) -> Result<Self> {
        let unique = format!("{name}-{}", std::process::id());
        let quota = PERIOD_US * percent / 100;
        let v2_root = Path::new("/sys/fs/cgroup");
        let v2 = std::fs::read_to_string(v2_root.join("cgroup.subtree_control"))
            .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "cpu"));
        let dir = if v2 {
            v2_root.join(&unique)
        } else {
            let v1_root = Path::new("/sys/fs/cgroup/cpu");
            if !v1_root.join("cpu.cfs_quota_us").exists() {
                bail!("no CPU cgroup controller (neither v2 nor v1) is mounted");
            }
            v1_root.join(&unique)
        };
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let cgroup = Self { dir };
        if v2 {
            cgroup.write("cpu.max", &format!("{quota} {PERIOD_US}"))?;
        } else {
            cgroup.write("cpu.cfs_period_us", &PERIOD_US.to_string())?;
            cgroup.write("cpu.cfs_quota_us", &quota.to_string())?;
        }
        Ok(cgroup)
    }

    /// Moves process `pid` (all its threads) into the cgroup; threads it starts later follow.
    pub fn add(&self, pid: u32) -> Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        std::fs::write(self.dir.join(file), value)
            .with_context(|| format!("writing {value} to {file}"))
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}
