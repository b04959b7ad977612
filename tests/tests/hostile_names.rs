//! End to end on names a profiled process chooses: a process whose executable, `comm`, thread
//! name and function symbol hold terminal escapes (ESC, BEL, newline, a C1 CSI) gets profiles
//! that show them replaced by `?` in every output (SECURITY.md, "Hazards closed"): the local
//! pprof files and their names, the SVG flame graphs (which must stay well-formed XML), the
//! Pyroscope push and the live stream.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use profiler_daemon::pprof::{decode, proto};
use profiler_tests::receiver::{recorded_pushes, Receiver};
use profiler_tests::*;

/// The workload's executable file name: the service name a process without a better one gets.
const EXECUTABLE: &str = "hostile\u{1b}[31m\u{7}";
/// The names the workload sets (tests/workloads/hostile_names.c) and how profiles must show
/// them. The thread's begins with an escape, so its file name would too.
const EXECUTABLE_SHOWN: &str = "hostile?[31m?";
const COMM_SHOWN: &str = "?[31m<&X??";
const THREAD_SHOWN: &str = "?]0;pwn??";
const SPIN_SHOWN: &str = "spin?[2J??";

/// Whether `text` has a character no output may carry raw. Written out here rather than taken
/// from the daemon, so the test does not share the rule it checks.
fn has_unprintable(text: &str) -> bool {
    text.chars()
        .any(|c| c.is_control() || c == '\u{fffe}' || c == '\u{ffff}')
}

/// Lines of tool output may end in newlines; nothing else unprintable.
fn has_unprintable_besides_lines(text: &str) -> bool {
    text.lines().any(has_unprintable)
}

/// Every string of `profile` is printable (labels, function and file names, sample types).
#[track_caller]
fn assert_printable(path: &Path, profile: &proto::Profile) {
    let raw: Vec<&String> = profile
        .string_table
        .iter()
        .filter(|s| has_unprintable(s))
        .collect();
    assert!(raw.is_empty(), "{}: raw strings {raw:?}", path.display());
}

/// Every pprof file in `dir` (all are the workload's), decoded and checked printable.
fn printable_profiles(dir: &Path) -> Vec<(PathBuf, proto::Profile)> {
    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(dir).expect("profiles directory") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("a name").to_string_lossy();
        assert!(
            name.chars().all(|c| c.is_ascii_graphic()),
            "file name {name:?} holds more than visible ASCII"
        );
        if name.ends_with(".pb.gz") {
            let profile = decode(&std::fs::read(&path).expect("readable")).expect("decodes");
            assert_printable(&path, &profile);
            profiles.push((path, profile));
        }
    }
    profiles
}

#[test]
fn names_with_terminal_escapes_are_shown_replaced_in_every_output() {
    let started = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let built = compile_c_with(
        "hostile_names.c",
        dir.path(),
        &["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"],
    )
    .expect("compiles");
    let binary = dir.path().join(EXECUTABLE);
    std::fs::rename(&built, &binary).expect("renamed");
    let workload = Workload::spawn(Command::new(&binary).arg("60")).expect("starts");
    let pid = workload.pid().to_string();

    let receiver = Receiver::start(0, &dir.path().join("received"), &[]).expect("receiver");
    let config = dir.path().join("config.toml");
    // Flame graphs are off by default when profiles are exported; with threads = "thread"
    // every flame graph draws each thread's name, so its shown form is checked there too.
    std::fs::write(&config, "flame_graphs = true\nthreads = \"thread\"\n").expect("config written");
    let address = format!(
        "127.0.0.1:{}",
        free_local_address().expect("free port").port()
    );
    let out = dir.path().join("profiles");
    let daemon = DaemonRun::new()
        .config(&config)
        .pid(workload.pid())
        .frequency(99)
        .interval(1)
        .duration(4)
        .pyroscope(&receiver.url())
        .stream(&address)
        .output(&out)
        .start(dir.path());
    daemon
        .wait_for_log("serving the live profile stream", Duration::from_secs(30))
        .expect("stream served");
    let streamed = dir.path().join("streamed");
    let subscribe = |sink: &[&str]| {
        Command::new(daemon_binary())
            .args(["subscribe", &address, "--pid", &pid])
            .args(sink)
            .stdout(Stdio::piped())
            .spawn()
            .expect("subscriber starts")
    };
    let to_files = subscribe(&["--output", streamed.to_str().expect("utf-8")]);
    let top = subscribe(&["--top", "5", "--count", "1"]);
    let (status, _) = daemon.wait(Duration::from_secs(60)).expect("daemon exits");
    assert!(status.success(), "daemon failed");

    // Local files: names, every string, the labels, the symbol.
    let local = printable_profiles(&out);
    assert!(!local.is_empty(), "no local profile");
    for (path, _) in &local {
        let name = path.file_name().expect("a name").to_string_lossy();
        assert!(
            name.ends_with(&format!("-{pid}-__31m__X__@hostile%3F%5B31m%3F.pb.gz")),
            "{name}: the comm's characters other than [A-Za-z0-9._-] become `_`, the \
             service's (as shown) are percent-encoded"
        );
    }
    let mut thread_names = std::collections::BTreeSet::new();
    for (path, profile) in &local {
        for sample in &profile.sample {
            assert_eq!(
                label(profile, sample, "comm"),
                Some(COMM_SHOWN),
                "{}",
                path.display()
            );
            thread_names.extend(label(profile, sample, "thread_name"));
        }
    }
    assert_eq!(
        thread_names,
        [COMM_SHOWN, THREAD_SHOWN].into(),
        "both threads sampled, each under its name as shown"
    );
    let frames = frame_names(&local);
    assert!(
        frames.iter().any(|name| name == SPIN_SHOWN),
        "the spinning function's symbol, shown replaced: {:?}",
        frames.iter().take(20).collect::<Vec<_>>()
    );
    let top_table = go_pprof_top(&local[0].0).expect("go tool pprof reads the file");
    assert!(
        top_table.contains(SPIN_SHOWN) && !has_unprintable_besides_lines(&top_table),
        "pprof -top output:\n{top_table}"
    );

    // Flame graphs: well-formed XML (no raw control character, even escaped, is allowed in it),
    // titled with the comm as shown.
    let (mut svgs, mut thread_drawn, mut spin_drawn) = (0, false, false);
    for (path, _) in &local {
        let svg = path.with_extension("").with_extension("svg");
        let lint = Command::new("xmllint")
            .arg("--noout")
            .arg(&svg)
            .output()
            .expect("xmllint runs (cargo xtask test installs libxml2-utils)");
        assert!(
            lint.status.success(),
            "{} is not well-formed XML: {}",
            svg.display(),
            String::from_utf8_lossy(&lint.stderr)
        );
        let text = std::fs::read_to_string(&svg).expect("an SVG beside each profile");
        let title = text
            .lines()
            .find(|line| line.contains("id=\"title\""))
            .unwrap_or_default();
        assert!(
            title.contains("?[31m&lt;&amp;X??"),
            "{}: the title names the process as shown: {title}",
            svg.display()
        );
        // `;` separates frames where flame graphs are drawn from: it shows as `:`.
        thread_drawn |= text.contains(&THREAD_SHOWN.replace(';', ":"));
        spin_drawn |= text.contains(SPIN_SHOWN);
        svgs += 1;
    }
    assert_eq!(svgs, local.len());
    assert!(
        thread_drawn && spin_drawn,
        "flame graphs draw the thread and the function as shown"
    );

    // Pyroscope: the series labels are printable, and the service is named after the
    // executable as shown; the profiles pushed are printable too.
    let pushes = recorded_pushes(&receiver.record_dir).expect("records");
    let series: Vec<_> = pushes.iter().flat_map(|push| &push.series).collect();
    assert!(!series.is_empty(), "nothing pushed");
    for one in &series {
        assert!(
            !one.labels
                .iter()
                .any(|(name, value)| has_unprintable(name) || has_unprintable(value)),
            "series labels {:?}",
            one.labels
        );
        assert_eq!(one.label("service_name"), Some(EXECUTABLE_SHOWN));
        assert_eq!(one.label("process_executable_name"), Some(EXECUTABLE_SHOWN));
        for path in &one.profiles {
            let profile = decode(&std::fs::read(path).expect("raw profile")).expect("decodes");
            assert_printable(path, &profile);
            let roots: std::collections::BTreeSet<String> = profile
                .sample
                .iter()
                .filter_map(|sample| root_thread(&profile, sample))
                .map(|(name, _)| name)
                .collect();
            assert!(roots.contains(THREAD_SHOWN), "thread roots {roots:?}");
        }
    }

    // The live stream: files named from the service name, profiles and the client's table
    // printable.
    let output = to_files.wait_with_output().expect("subscriber exits");
    assert!(output.status.success(), "file subscriber failed");
    let streamed = printable_profiles(&streamed);
    assert!(!streamed.is_empty(), "nothing streamed");
    let output = top.wait_with_output().expect("subscriber exits");
    assert!(output.status.success(), "top subscriber failed");
    let table = String::from_utf8(output.stdout).expect("utf-8");
    eprintln!("{table}");
    assert!(
        table.contains(EXECUTABLE_SHOWN)
            && table.contains(SPIN_SHOWN)
            && !has_unprintable_besides_lines(&table),
        "subscriber table:\n{table:?}"
    );
    eprintln!("took {:.1} s", started.elapsed().as_secs_f64());
}
