//! The names of local profile files, written by the local output and the `subscribe` command,
//! read back by `view` and retention: `<kind>-<UTC start>-<pid>-<comm>@<service>.pb.gz` (and
//! `.svg`), e.g. `cpu-20261126T102000123Z-4242-java@orders.pb.gz`.
//!
//! The start has milliseconds: intervals of a second start a few microseconds either side of
//! a whole second, so two of them could start in the same second, and the second's file
//! replaced the first's. Names of whole seconds (written before) are still read.
//!
//! The service is in the name so that `view --service` selects an hour of a busy host's files
//! (thousands) from a directory listing, decoding only the files it merges; inside the pprof
//! it would cost a decode of every file. Names sort by time within a kind. Both the `comm` and
//! the service were chosen by the profiled process (or its pod), so neither can add a path
//! separator, `..` as a component, or a control character: the `comm` keeps `[A-Za-z0-9._-]`
//! and turns anything else into `_` (it is only shown); the service keeps the same characters
//! and percent-encodes any other byte, so a selection compares it exactly, and `@` (never in
//! either part) separates them.

use std::borrow::Cow;
use std::time::SystemTime;

use crate::profile_model::ProfileKind;

/// A service name longer than this (in bytes) is cut before encoding, so a name stays well
/// under the file system's 255 bytes whatever the service (3 bytes per encoded byte at most).
pub const MAX_SERVICE_BYTES: usize = 64;

pub const PPROF_SUFFIX: &str = ".pb.gz";
pub const SVG_SUFFIX: &str = ".svg";

/// The name of a file the local output writes, without its suffix.
pub fn file_stem(
    kind: ProfileKind,
    start: SystemTime,
    pid: u32,
    comm: &str,
    service: &str,
) -> String {
    format!(
        "{}-{}-{pid}-{}@{}",
        kind.file_prefix(),
        time_in_name(start),
        comm_in_name(comm),
        service_in_name(service)
    )
}

/// `2026-11-22T02:11:41.123Z` -> `20261122T021141123Z`: sortable, no colons.
fn time_in_name(start: SystemTime) -> String {
    humantime::format_rfc3339_millis(start)
        .to_string()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect()
}

fn is_kept(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.')
}

/// A process name as file names show it (and as `view --process` compares it).
pub fn comm_in_name(comm: &str) -> String {
    comm.chars()
        .map(|c| {
            if c.is_ascii() && is_kept(c as u8) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A service name as file names hold it: its first [`MAX_SERVICE_BYTES`], percent-encoded
/// outside `[A-Za-z0-9._-]` (as `view --service` compares it).
pub fn service_in_name(service: &str) -> String {
    let mut end = service.len().min(MAX_SERVICE_BYTES);
    while !service.is_char_boundary(end) {
        end -= 1;
    }
    let mut encoded = String::with_capacity(end);
    for &byte in &service.as_bytes()[..end] {
        if is_kept(byte) {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// Whether retention manages a file of this name: the local output's pprof files and flame
/// graphs, with or without a service (names written before services were recorded).
pub fn is_ours(name: &str) -> bool {
    let kind_prefix = name
        .split_once('-')
        .and_then(|(prefix, _)| ProfileKind::from_file_prefix(prefix));
    kind_prefix.is_some() && (name.ends_with(PPROF_SUFFIX) || name.ends_with(SVG_SUFFIX))
}

/// What the name of a pprof file says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileFileName<'a> {
    pub kind: ProfileKind,
    pub start: SystemTime,
    pub pid: u32,
    /// As in the name ([`comm_in_name`]).
    pub comm: &'a str,
    /// As in the name ([`service_in_name`]); `None` in names written before services were.
    pub service: Option<&'a str>,
}

impl<'a> ProfileFileName<'a> {
    /// Reads a pprof file's name; `None` for anything else.
    pub fn parse(name: &'a str) -> Option<Self> {
        let stem = name.strip_suffix(PPROF_SUFFIX)?;
        let (prefix, rest) = stem.split_once('-')?;
        let kind = ProfileKind::from_file_prefix(prefix)?;
        let (time, rest) = rest.split_once('-')?;
        let (pid, rest) = rest.split_once('-')?;
        let (comm, service) = match rest.split_once('@') {
            Some((comm, service)) => (comm, Some(service)),
            None => (rest, None),
        };
        Some(Self {
            kind,
            start: parse_time(time)?,
            pid: pid.parse().ok()?,
            comm,
            service,
        })
    }

    /// The service, decoded (as cut to [`MAX_SERVICE_BYTES`]).
    pub fn service_name(&self) -> Option<Cow<'a, str>> {
        let service = self.service?;
        if !service.contains('%') {
            return Some(Cow::Borrowed(service));
        }
        let bytes = service.as_bytes();
        let mut decoded = Vec::with_capacity(bytes.len());
        let mut at = 0;
        while at < bytes.len() {
            if bytes[at] == b'%' {
                let hex = service.get(at + 1..at + 3)?;
                decoded.push(u8::from_str_radix(hex, 16).ok()?);
                at += 3;
            } else {
                decoded.push(bytes[at]);
                at += 1;
            }
        }
        Some(Cow::Owned(String::from_utf8_lossy(&decoded).into_owned()))
    }
}

/// `20261122T021141123Z` (or `20261122T021141Z`, whole seconds) -> the time it names.
fn parse_time(time: &str) -> Option<SystemTime> {
    let digits = time.strip_suffix('Z')?.as_bytes();
    let millis = match digits.len() {
        15 => "",
        18 => time.get(15..18)?,
        _ => return None,
    };
    let well_formed = digits[8] == b'T'
        && digits[..8]
            .iter()
            .chain(&digits[9..])
            .all(u8::is_ascii_digit);
    if !well_formed {
        return None;
    }
    let fraction = if millis.is_empty() {
        String::new()
    } else {
        format!(".{millis}")
    };
    let text = format!(
        "{}-{}-{}T{}:{}:{}{fraction}Z",
        &time[..4],
        &time[4..6],
        &time[6..8],
        &time[9..11],
        &time[11..13],
        &time[13..15]
    );
    humantime::parse_rfc3339(&text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn start() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)
    }

    #[test]
    fn file_names_sort_by_time_and_are_safe() {
        assert_eq!(
            format!(
                "{}.pb.gz",
                file_stem(ProfileKind::Cpu, start(), 42, "java/Main x", "orders")
            ),
            "cpu-20231114T221320000Z-42-java_Main_x@orders.pb.gz"
        );
        // A `comm` is any 15 bytes a process chose: escapes, separators, `..`; a service name
        // comes from the process's command line or its pod.
        assert_eq!(
            file_stem(
                ProfileKind::OffCpu,
                start(),
                7,
                "\u{1b}[31m/..\u{7}\n\u{9b}",
                "ns/a b@..\u{1b}é"
            ),
            "offcpu-20231114T221320000Z-7-__31m_..___@ns%2Fa%20b%40..%1B%C3%A9"
        );
        let later = file_stem(
            ProfileKind::Cpu,
            start() + Duration::from_secs(10),
            1,
            "a",
            "b",
        );
        assert!(later > file_stem(ProfileKind::Cpu, start(), 99999, "z", "z"));
        // Two intervals of a second, one starting just after a whole second and the next just
        // before the following one, get two names.
        let just_after = start() + Duration::from_micros(300);
        let just_before_next = start() + Duration::from_micros(999_950);
        assert_ne!(
            file_stem(ProfileKind::Cpu, just_after, 1, "a", "b"),
            file_stem(ProfileKind::Cpu, just_before_next, 1, "a", "b")
        );
    }

    #[test]
    fn long_service_names_are_cut_on_a_character_boundary() {
        let long = "é".repeat(100);
        let encoded = service_in_name(&long);
        assert_eq!(encoded, "%C3%A9".repeat(MAX_SERVICE_BYTES / 2));
        let stem = file_stem(
            ProfileKind::OffCpu,
            start(),
            u32::MAX,
            &"x".repeat(15),
            &long,
        );
        assert!(stem.len() + PPROF_SUFFIX.len() < 255, "{}", stem.len());
    }

    #[test]
    fn names_read_back_as_written() {
        let name = format!(
            "{}.pb.gz",
            file_stem(
                ProfileKind::OffCpu,
                start(),
                4242,
                "java",
                "default/orders-api"
            )
        );
        let parsed = ProfileFileName::parse(&name).expect("ours");
        assert_eq!(
            parsed,
            ProfileFileName {
                kind: ProfileKind::OffCpu,
                start: start(),
                pid: 4242,
                comm: "java",
                service: Some("default%2Forders-api"),
            }
        );
        assert_eq!(parsed.service_name().as_deref(), Some("default/orders-api"));
        // Milliseconds are read back.
        let later = start() + Duration::from_millis(1_234);
        let name = format!("{}.pb.gz", file_stem(ProfileKind::Cpu, later, 1, "a", "b"));
        assert_eq!(ProfileFileName::parse(&name).map(|p| p.start), Some(later));
        // Written before services were recorded, and before milliseconds.
        let old =
            ProfileFileName::parse("cpu-20231114T221320Z-42-java_Main_x.pb.gz").expect("ours");
        assert_eq!((old.pid, old.comm, old.service), (42, "java_Main_x", None));
        assert_eq!(old.start, start());
        for other in [
            "cpu-20231114T221320Z-42-x@s.svg",
            "heap-20231114T221320Z-42-x@s.pb.gz",
            "cpu-2023-11-14-42-x@s.pb.gz",
            "cpu-20231114T221320Z-x-x@s.pb.gz",
            "cpu-20231114T221320Z-42-x@%zz.pb.gz",
            "notes.txt",
        ] {
            let parsed = ProfileFileName::parse(other);
            assert!(
                parsed.is_none() || parsed.and_then(|p| p.service_name()).is_none(),
                "{other}"
            );
        }
    }

    #[test]
    fn retention_manages_pprof_files_and_flame_graphs_of_both_forms() {
        for name in [
            "cpu-20231114T221320Z-42-java@orders.pb.gz",
            "offcpu-20231114T221320Z-42-java@orders.svg",
            "cpu-20231114T221320Z-42-java.pb.gz",
            "alloc-20231114T221320Z-42-java@orders.pb.gz",
        ] {
            assert!(is_ours(name), "{name}");
        }
        for name in [
            "notes.txt",
            "cpu-x.txt",
            "view.svg",
            ".cpu-1.pb.gz.tmp",
            "heap-1.pb.gz",
        ] {
            assert!(!is_ours(name), "{name}");
        }
    }
}
