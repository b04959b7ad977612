//! `/proc/PID/status` (or a task's), parsed by procfs from text the caller read: a profiled
//! process's status is read through `untrusted::read_proc_text` (bounded, no symlinks followed),
//! then its fields come from one parser instead of line scans in each module.

use procfs::process::Status;
use procfs::FromBufRead as _;

/// The status in `text`, or `None` if the kernel's format is not there.
pub fn parse(text: &str) -> Option<Status> {
    Status::from_buf_read(text.as_bytes()).ok()
}

/// A status text for tests: this process's own, with the `overrides` lines (`"NSpid:\t7"`)
/// in place of the lines of the same fields.
#[cfg(test)]
pub fn test_status(overrides: &[&str]) -> String {
    let own = std::fs::read_to_string("/proc/self/status").expect("own status");
    own.lines()
        .filter(|line| {
            let field = line.split(':').next().unwrap_or("");
            !overrides.iter().any(|o| o.split(':').next() == Some(field))
        })
        .chain(overrides.iter().copied())
        .map(|line| format!("{line}\n"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_status_parses_and_overrides_apply() {
        let status = parse(&test_status(&[
            "NSpid:\t4711\t12",
            "SigCgt:\t0000000000000004",
        ]))
        .expect("parses");
        assert_eq!(status.nspid, Some(vec![4711, 12]));
        assert_eq!(status.sigcgt, 4);
        assert!(parse("Name:\tx\n").is_none());
        assert!(parse("").is_none());
    }
}
