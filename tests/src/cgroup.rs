//! A memory cgroup of a test's own, to measure what the kernel charges a process (resident
//! anonymous memory, the page cache of the files it maps and reads, kernel memory such as BPF
//! maps) and to hold it to a limit, as a container runtime does. cgroup v2 where the memory
//! controller is there, else v1's memory hierarchy (this machine's Debian mounts both).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};

pub struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// A new cgroup `name` (made unique with our pid) limited to `limit` bytes.
    pub fn create(name: &str, limit: u64) -> Result<Self> {
        let unique = format!("{name}-{}", std::process::id());
        let v2_root = Path::new("/sys/fs/cgroup");
        let v2 = std::fs::read_to_string(v2_root.join("cgroup.subtree_control"))
            .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "memory"));
        let (dir, limit_file) = if v2 {
            (v2_root.join(&unique), "memory.max")
        } else {
            let v1_root = Path::new("/sys/fs/cgroup/memory");
            if !v1_root.join("memory.limit_in_bytes").exists() {
                bail!("no memory cgroup controller (neither v2 nor v1) is mounted");
            }
            (v1_root.join(&unique), "memory.limit_in_bytes")
        };
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let cgroup = Self { dir, v2 };
        std::fs::write(cgroup.dir.join(limit_file), limit.to_string())
            .with_context(|| format!("setting {limit_file}"))?;
        Ok(cgroup)
    }

    /// Writing a pid here moves that process into the cgroup.
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// The most the cgroup was ever charged, in bytes.
    pub fn peak(&self) -> Result<u64> {
        self.read_number(if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        })
    }

    /// What the cgroup is charged now, in bytes.
    pub fn current(&self) -> Result<u64> {
        self.read_number(if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        })
    }

    /// Processes of the cgroup the kernel killed for want of memory.
    pub fn oom_kills(&self) -> Result<u64> {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = std::fs::read_to_string(self.dir.join(file))?;
        Ok(text
            .lines()
            .find_map(|line| line.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0))
    }

    /// A `memory.stat` entry (`anon` / `file` in v2; `rss` / `cache` in v1), in bytes.
    pub fn stat(&self, key: &str) -> Result<u64> {
        let text = std::fs::read_to_string(self.dir.join("memory.stat"))?;
        text.lines()
            .find_map(|line| {
                let (name, value) = line.split_once(' ')?;
                (name == key).then(|| value.trim().parse().ok()).flatten()
            })
            .with_context(|| format!("no {key} in memory.stat"))
    }

    /// Whether this is cgroup v2 (else v1): their `memory.stat` names differ.
    pub fn is_v2(&self) -> bool {
        self.v2
    }

    fn read_number(&self, file: &str) -> Result<u64> {
        let text = std::fs::read_to_string(self.dir.join(file))
            .with_context(|| format!("reading {file}"))?;
        text.trim()
            .parse()
            .with_context(|| format!("{file}: {text:?}"))
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Empty once its processes have exited; a cgroup with members cannot be removed.
        let _ = std::fs::remove_dir(&self.dir);
    }
}
