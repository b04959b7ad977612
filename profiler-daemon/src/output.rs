//! Local output: one gzipped pprof file per process per interval.
//!
//! Files are written under a temporary name and renamed, so a reader never sees half a file.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::pprof::{encode_gzipped, proto};

pub struct LocalWriter {
    dir: PathBuf,
}

impl LocalWriter {
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// Writes `cpu-<UTC time>-<pid>-<comm>.pb.gz` and returns its path.
    pub fn write(
        &self,
        start: SystemTime,
        pid: u32,
        comm: &str,
        profile: &proto::Profile,
    ) -> std::io::Result<PathBuf> {
        let name = file_name(start, pid, comm);
        let path = self.dir.join(&name);
        let temporary = self.dir.join(format!(".{name}.tmp"));
        std::fs::write(&temporary, encode_gzipped(profile)?)?;
        std::fs::rename(&temporary, &path)?;
        Ok(path)
    }
}

fn file_name(start: SystemTime, pid: u32, comm: &str) -> String {
    // 2026-11-22T02:11:41Z -> 20261122T021141Z: sortable, no colons.
    let time: String = humantime::format_rfc3339_seconds(start)
        .to_string()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let comm: String = comm
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("cpu-{time}-{pid}-{comm}.pb.gz")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn file_names_sort_by_time_and_are_safe() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            file_name(start, 42, "java/Main x"),
            "cpu-20231114T221320Z-42-java_Main_x.pb.gz"
        );
    }

    #[test]
    fn writes_a_readable_profile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let writer = LocalWriter::new(&dir.path().join("out")).expect("creates the directory");
        let profile = proto::Profile {
            string_table: vec![String::new()],
            ..Default::default()
        };
        let path = writer
            .write(SystemTime::now(), 1, "x", &profile)
            .expect("writes");
        let back = crate::pprof::decode(&std::fs::read(path).expect("reads")).expect("decodes");
        assert_eq!(back, profile);
    }
}
