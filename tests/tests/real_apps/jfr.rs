//! Reading a JFR recording with the recording JDK's own parser (`tests/java/JfrSamples.java`):
//! execution samples, allocation events and lock events, with names normalized as the daemon
//! writes them.

use std::path::Path;
use std::process::{Command, Stdio};

use profiler_tests::Jdk;

/// One JFR execution sample: frames innermost first, as (type, `class.method`).
pub(crate) struct JfrSample {
    pub(crate) nanos: i64,
    pub(crate) truncated: bool,
    pub(crate) thread: String,
    pub(crate) frames: Vec<(String, String)>,
}

/// The two kinds of allocation event, as both profilers split them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AllocKind {
    /// A thread took a new TLAB for the object: weighed by the TLAB's size.
    InNewTlab = 0,
    /// The object was allocated outside any TLAB: weighed by its own size.
    OutsideTlab = 1,
}

impl AllocKind {
    pub(crate) const ALL: [AllocKind; 2] = [AllocKind::InNewTlab, AllocKind::OutsideTlab];

    pub(crate) fn name(self) -> &'static str {
        match self {
            AllocKind::InNewTlab => "in_new_tlab",
            AllocKind::OutsideTlab => "outside_tlab",
        }
    }
}

/// One JFR allocation event: its weight in bytes (`tlabSize` in a new TLAB, `allocationSize`
/// outside), the allocated class in Java form, and its stack's innermost frame, `class.method`
/// (JFR's stacks have Java methods only), if it has a stack: what a site needs.
pub(crate) struct JfrAlloc {
    pub(crate) nanos: i64,
    pub(crate) kind: AllocKind,
    pub(crate) bytes: i64,
    pub(crate) class: String,
    pub(crate) method: Option<String>,
}

/// JFR's allocation events, in the order of [`AllocKind`].
pub(crate) const JFR_ALLOC_EVENTS: [&str; 2] = [
    "jdk.ObjectAllocationInNewTLAB",
    "jdk.ObjectAllocationOutsideTLAB",
];

/// JFR's lock events, in the order of [`LockKind`].
pub(crate) const JFR_LOCK_EVENTS: [&str; 2] = ["jdk.JavaMonitorEnter", "jdk.ThreadPark"];

/// The two kinds of lock wait, as both profilers split them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockKind {
    /// Waiting to enter a contended monitor: the daemon's `mutex` profile.
    MonitorEnter = 0,
    /// Parked (`LockSupport.park`): the daemon's `block` profile.
    Park = 1,
}

impl LockKind {
    pub(crate) const ALL: [LockKind; 2] = [LockKind::MonitorEnter, LockKind::Park];

    pub(crate) fn name(self) -> &'static str {
        match self {
            LockKind::MonitorEnter => "monitor_enter",
            LockKind::Park => "park",
        }
    }
}

/// One JFR lock event: when it ended, how long it waited, and its stack's frames innermost
/// first (`class.method`).
pub(crate) struct JfrLock {
    pub(crate) end_nanos: i64,
    pub(crate) kind: LockKind,
    pub(crate) nanos: i64,
    pub(crate) frames: Vec<String>,
}

pub(crate) struct JfrRecording {
    pub(crate) samples: Vec<JfrSample>,
    /// What `jfr summary` counts: every sample must have been read.
    pub(crate) summary_count: Option<u64>,
    pub(crate) allocs: Vec<JfrAlloc>,
    /// What `jfr summary` counts of each [`JFR_ALLOC_EVENTS`].
    pub(crate) alloc_summary: [Option<u64>; 2],
    pub(crate) locks: Vec<JfrLock>,
    /// What `jfr summary` counts of each [`JFR_LOCK_EVENTS`].
    pub(crate) lock_summary: [Option<u64>; 2],
}

/// `class.method` frames of a `JfrSamples` line, as (type, name).
pub(crate) fn jfr_frames<'a>(fields: impl Iterator<Item = &'a str>) -> Vec<(String, String)> {
    fields
        .map(|f| {
            let (kind, name) = f.split_once('|').unwrap_or(("", f));
            (kind.to_owned(), normalize(name))
        })
        .collect()
}

/// The first `N` tab-separated fields of a `JfrSamples` line, and the rest (its frames).
fn leading_fields<const N: usize>(line: &str) -> Option<([&str; N], std::str::Split<'_, char>)> {
    let mut fields = line.split('\t');
    let mut leading = [""; N];
    for field in &mut leading {
        *field = fields.next()?;
    }
    Some((leading, fields))
}

/// The JVMs that read the recording compile with C1 only: they run for a second or two, too
/// short for C2's compilations to pay on a busy machine (JfrSamples on Jetty's recording: 0.7 s
/// instead of 1.5 s).
const C1_ONLY: &str = "-XX:TieredStopAtLevel=1";
const C1_ONLY_LAUNCHER: &str = "-J-XX:TieredStopAtLevel=1";

/// Reads the recording with the same JDK: `jfr summary` for the counts, the JDK's
/// `jdk.jfr.consumer` parser (`JfrSamples`) for the samples, allocation and lock events.
pub(crate) fn read_jfr(jdk: &Jdk, helper: &Path, file: &Path) -> anyhow::Result<JfrRecording> {
    use anyhow::{bail, Context as _};
    let bin = jdk.java.parent().context("JDK bin directory")?;
    // Both at once: each is a JVM of its own, on an otherwise idle machine by now.
    let summary = Command::new(bin.join("jfr"))
        .arg(C1_ONLY_LAUNCHER)
        .arg("summary")
        .arg(file)
        .stdout(Stdio::piped())
        .spawn()?;
    let output = Command::new(&jdk.java)
        .arg(C1_ONLY)
        .arg("-cp")
        .arg(helper)
        .arg("JfrSamples")
        .arg(file)
        .args(["--alloc", "--lock"])
        .output()?;
    let summary = summary.wait_with_output()?;
    let summary = String::from_utf8_lossy(&summary.stdout);
    let summary_count = |event: &str| {
        summary.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some(event)).then(|| words.next()?.parse().ok())?
        })
    };
    if !output.status.success() {
        bail!(
            "reading {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut samples = Vec::new();
    let mut allocs = Vec::new();
    let mut locks = Vec::new();
    for line in text.lines() {
        if let Some(lock) = line.strip_prefix("lock\t") {
            let Some(([end_nanos, kind, nanos, _class, _truncated, _thread], frames)) =
                leading_fields(lock)
            else {
                bail!("malformed JfrSamples lock line {line:?}");
            };
            locks.push(JfrLock {
                end_nanos: end_nanos.parse().context("lock event end")?,
                kind: match kind {
                    "monitor_enter" => LockKind::MonitorEnter,
                    "park" => LockKind::Park,
                    _ => bail!("lock kind {kind:?} in {line:?}"),
                },
                nanos: nanos.parse().context("lock event duration")?,
                frames: jfr_frames(frames)
                    .into_iter()
                    .map(|(_, name)| name)
                    .collect(),
            });
            continue;
        }
        if let Some(alloc) = line.strip_prefix("alloc\t") {
            let Some(([nanos, kind, bytes, class, _truncated, _thread], frames)) =
                leading_fields(alloc)
            else {
                bail!("malformed JfrSamples alloc line {line:?}");
            };
            allocs.push(JfrAlloc {
                nanos: nanos.parse().context("allocation time")?,
                kind: match kind {
                    "in_new_tlab" => AllocKind::InNewTlab,
                    "outside_tlab" => AllocKind::OutsideTlab,
                    _ => bail!("allocation kind {kind:?} in {line:?}"),
                },
                bytes: bytes.parse().context("allocation size")?,
                class: normalize_class(class),
                method: jfr_frames(frames.take(1)).pop().map(|(_, name)| name),
            });
            continue;
        }
        let Some(([nanos, truncated, thread], frames)) = leading_fields(line) else {
            bail!("malformed JfrSamples line {line:?}");
        };
        samples.push(JfrSample {
            nanos: nanos.parse().context("sample time")?,
            truncated: truncated == "1",
            thread: thread.to_owned(),
            frames: jfr_frames(frames),
        });
    }
    Ok(JfrRecording {
        samples,
        summary_count: summary_count("jdk.ExecutionSample"),
        allocs,
        alloc_summary: JFR_ALLOC_EVENTS.map(summary_count),
        locks,
        lock_summary: JFR_LOCK_EVENTS.map(summary_count),
    })
}

/// A hidden class's address suffix dropped, as the daemon drops it, so both profilers' names
/// compare: `pkg.Class/0x0000000800c0c000.method` (JFR up to JDK 21),
/// `pkg.Class+0x0000000800c0c000.712256162.method` (JDK 17's, with JFR's own number after it),
/// `pkg.Class.0x77108000.method` (JDK 25) -> `pkg.Class.method`.
pub(crate) fn normalize(name: &str) -> String {
    match name.rsplit_once('.') {
        Some((class, method)) => format!("{}.{method}", normalize_class(class)),
        None => name.to_owned(),
    }
}

/// A class name without a hidden class's suffix (`pkg.Foo$$Lambda/0x0000000800c03000`,
/// `+0x...` or `.0x...`, as JFR names it, -> `pkg.Foo$$Lambda`), as the daemon names classes.
/// No part of a Java name starts with a digit: what follows one of these markers is JFR's.
pub(crate) fn normalize_class(name: &str) -> String {
    let element = name.trim_end_matches("[]");
    let end = ["/", "+0x", ".0x"]
        .iter()
        .filter_map(|marker| element.find(marker))
        .min()
        .unwrap_or(element.len());
    format!("{}{}", &element[..end], &name[element.len()..])
}
