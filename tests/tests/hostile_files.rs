//! Hostile files against the root daemon (SECURITY.md): a profiled user's ELF files whose headers
//! lie, libraries that share another file's build-id, and a process that maps hundreds of
//! libraries. Each runs beside a bystander (tests/src/hostile.rs) that must keep being profiled,
//! or against a victim of another user whose exact frame names are checked.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use object::{Object as _, ObjectSection as _};
use profiler_tests::hostile::{
    unprivileged_user, with_debug_links_to, AttackContext, HostileRun, Scenario, User,
};
use profiler_tests::*;

/// `sh_flags` of a section whose bytes start with an `Elf64_Chdr`.
const SHF_COMPRESSED: u64 = 0x800;
/// What the crafted sections claim to inflate to.
const ONE_TEBIBYTE: u64 = 1 << 40;

/// The offsets of section `name`'s header and of its bytes, in a 64-bit little-endian ELF file.
fn section_offsets(data: &[u8], name: &str) -> (usize, usize) {
    let elf = object::File::parse(data).expect("an ELF file");
    let section = elf
        .section_by_name(name)
        .unwrap_or_else(|| panic!("no {name}"));
    let shoff = u64::from_le_bytes(data[0x28..0x30].try_into().expect("8 bytes")) as usize;
    let entsize = u16::from_le_bytes(data[0x3a..0x3c].try_into().expect("2 bytes")) as usize;
    let (offset, _) = section.file_range().expect("in the file");
    (shoff + section.index().0 * entsize, offset as usize)
}

/// Rewrites `path` so that section `name` is marked compressed (zlib) and its `Elf64_Chdr`
/// claims `claimed` bytes: its own compression header if it has one, else one written over
/// its first bytes.
fn claim_inflated_size(path: &Path, name: &str, claimed: u64) {
    let mut data = std::fs::read(path).expect("readable");
    let (header, bytes) = section_offsets(&data, name);
    let flags = u64::from_le_bytes(data[header + 8..header + 16].try_into().expect("8 bytes"));
    if flags & SHF_COMPRESSED == 0 {
        data[header + 8..header + 16].copy_from_slice(&(flags | SHF_COMPRESSED).to_le_bytes());
        data[bytes..bytes + 4].copy_from_slice(&1u32.to_le_bytes());
        data[bytes + 16..bytes + 24].copy_from_slice(&1u64.to_le_bytes());
    }
    data[bytes + 8..bytes + 16].copy_from_slice(&claimed.to_le_bytes());
    std::fs::write(path, data).expect("written");
}

/// native_split.c built with `flags` into a directory of its own under `dir`, named `name`.
fn native_split(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let own = dir.join(format!("{name}.d"));
    std::fs::create_dir(&own).expect("mkdir");
    let mut all = vec!["-O1", "-g", "-fno-omit-frame-pointer"];
    all.extend_from_slice(flags);
    let built = compile_c_with("native_split.c", &own, &all).expect("gcc");
    let binary = dir.join(name);
    std::fs::rename(built, &binary).expect("renamed");
    binary
}

fn make_readable(dir: &Path) {
    let status = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(dir)
        .status()
        .expect("chmod");
    assert!(status.success());
}

/// `program` as `user`, running native_split's loop for a minute.
fn spawn_as(user: User, program: &Path) -> Workload {
    Workload::spawn(user.command(program).arg("60")).expect("starts")
}

/// Whether `pid`'s profiles in the run's output name `function`.
fn named_in_profiles(output: &Path, pid: u32, function: &str) -> bool {
    let profiles = profiles_of(&output.join("profiles"), pid).expect("profiles readable");
    frame_names(&profiles)
        .iter()
        .any(|name| name.contains(function))
}

/// The daemon as the attacked-daemon tests here run it: every process, 99 Hz, and a 24 MiB
/// cache budget (half of it, 12 MiB, for unwind tables). One scenario, so that its baseline
/// (the run without an attack) is measured once for all of them.
fn scenario() -> &'static (Scenario, HostileRun) {
    static SCENARIO: OnceLock<(Scenario, HostileRun)> = OnceLock::new();
    SCENARIO.get_or_init(|| {
        let config =
            std::env::temp_dir().join(format!("hostile-files-{}.toml", std::process::id()));
        std::fs::write(&config, "cache_budget_mib = 24\n").expect("config written");
        let scenario = Scenario::new(Duration::from_secs(18))
            .whole_host()
            .daemon_args(&[
                "--frequency",
                "99",
                "--config",
                config.to_str().expect("utf-8"),
            ]);
        let baseline = scenario.run_baseline();
        (scenario, baseline)
    })
}

/// Item 1 and 2 of the threat model's crafted files: a note section claiming to inflate to
/// 1 TiB (blazesym's build-id reader allocated that: the daemon aborted), a compressed
/// `.debug_info` claiming 1 TiB in a file sharing a harmless file's build-id (the first file's
/// verdict, "DWARF may be read", was applied to the second), and a file sharing another's
/// build-id whose debug links name a FIFO (the symbolizer blocked in `openat` for good). The
/// daemon must stay up, exit promptly, keep profiling the bystander, and still name the
/// attackers' own frames from their symbol tables.
#[test]
fn crafted_elf_files_neither_crash_nor_hang_the_daemon() {
    let user = unprivileged_user();
    let (scenario, baseline) = scenario();
    let (attacked, (attackers, _running)) = scenario.run(|context: &AttackContext| {
        let dir = context.scratch;
        let note_bomb = native_split(dir, "note_bomb", &["-Wl,--build-id"]);
        claim_inflated_size(&note_bomb, ".note.gnu.build-id", ONE_TEBIBYTE);
        let shared_x = "-Wl,--build-id=0x5ec0de0000000000000000000000000000000001";
        let shared_y = "-Wl,--build-id=0x5ec0de0000000000000000000000000000000002";
        let plain_x = native_split(dir, "plain_x", &[shared_x]);
        let dwarf_bomb = native_split(dir, "dwarf_bomb", &[shared_x, "-gz=zlib"]);
        claim_inflated_size(&dwarf_bomb, ".debug_info", ONE_TEBIBYTE);
        let plain_y = native_split(dir, "plain_y", &[shared_y]);
        let linked_y_source = native_split(dir, "linked_y_source", &[shared_y]);
        let fifo = dir.join("debug-fifo");
        assert!(Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo")
            .success());
        let fifo_linked = dir.join("fifo_linked");
        with_debug_links_to(&linked_y_source, &fifo, &fifo_linked);
        make_readable(dir);

        // The harmless files first, so that they are the ones the build-ids were first seen
        // with; the hostile ones once those have been symbolized (an interval later).
        let mut running = vec![
            spawn_as(user, &note_bomb),
            spawn_as(user, &plain_x),
            spawn_as(user, &plain_y),
        ];
        std::thread::sleep(Duration::from_secs(5));
        running.push(spawn_as(user, &dwarf_bomb));
        running.push(spawn_as(user, &fifo_linked));
        let pids: Vec<(&'static str, u32)> = [
            "note_bomb",
            "plain_x",
            "plain_y",
            "dwarf_bomb",
            "fifo_linked",
        ]
        .into_iter()
        .zip(running.iter().map(Workload::pid))
        .collect();
        (pids, running)
    });
    attacked.assert_unharmed(baseline);
    for (name, pid) in attackers {
        assert!(
            named_in_profiles(&attacked.output, pid, "hot_a"),
            "{name} (pid {pid}) is named from its own symbol table"
        );
    }
}

/// Item 3 of "names across users": a user copies a library of root's, keeps its build-id,
/// renames a function in the copy's symbol table, and runs root's program on the copy before
/// root does. Root's profiles must show root's name: names are shared only between files whose
/// symbol tables are the same, never by build-id.
#[test]
fn a_library_copy_with_a_renamed_symbol_never_names_another_users_frames() {
    let user = unprivileged_user();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let root_lib = dir.path().join("root");
    let copy_lib = dir.path().join("copy");
    for lib_dir in [&root_lib, &copy_lib] {
        std::fs::create_dir(lib_dir).expect("mkdir");
    }
    let library = root_lib.join("librenamed.so");
    let status = Command::new("gcc")
        .args([
            "-O1",
            "-fPIC",
            "-shared",
            "-fno-omit-frame-pointer",
            "-Wl,--build-id",
        ])
        .arg("-o")
        .arg(&library)
        .arg(workloads_dir().join("renamed_symbol_lib.c"))
        .status()
        .expect("gcc");
    assert!(status.success());
    let program = dir.path().join("renamed_symbol_main");
    let status = Command::new("gcc")
        .args(["-O1", "-fno-omit-frame-pointer", "-o"])
        .arg(&program)
        .arg(workloads_dir().join("renamed_symbol_main.c"))
        .arg(format!("-L{}", root_lib.display()))
        .arg("-lrenamed")
        .status()
        .expect("gcc");
    assert!(status.success());
    // The copy: same bytes, same build-id, `victim_hot` renamed in its symbol table.
    let mut copied = std::fs::read(&library).expect("readable");
    let mut renamed = 0;
    for at in 0..copied.len().saturating_sub(10) {
        if &copied[at..at + 10] == b"victim_hot" {
            copied[at..at + 10].copy_from_slice(b"stolen_hot");
            renamed += 1;
        }
    }
    assert!(renamed >= 1, "the name is in the copy's symbol table");
    std::fs::write(copy_lib.join("librenamed.so"), &copied).expect("copy written");
    make_readable(dir.path());

    let out = dir.path().join("profiles");
    std::fs::create_dir(&out).expect("mkdir");
    let daemon = DaemonRun::new()
        .frequency(49)
        .interval(1)
        .output(&out)
        .start(dir.path());
    daemon
        .wait_for_log("sampling", Duration::from_secs(60))
        .expect("the daemon samples");
    // The attacker's copy is seen and named first.
    let attacker = Workload::spawn(
        user.command(&program)
            .arg("60")
            .env("LD_LIBRARY_PATH", &copy_lib),
    )
    .expect("starts");
    wait_for_profile_naming(&out, attacker.pid(), "stolen_hot");
    let victim = Workload::spawn(
        Command::new(&program)
            .arg("60")
            .env("LD_LIBRARY_PATH", &root_lib),
    )
    .expect("starts");
    wait_for_profile_naming(&out, victim.pid(), "victim_hot");
    std::thread::sleep(Duration::from_secs(2));
    let profiles = profiles_of(&out, victim.pid()).expect("profiles");
    let names = frame_names(&profiles);
    assert!(
        names.iter().any(|name| name.contains("victim_hot")),
        "root's frames carry root's name: {names:?}"
    );
    assert!(
        !names.iter().any(|name| name.contains("stolen_hot")),
        "never the attacker's: {names:?}"
    );
    drop(daemon);
}

/// Waits (at most 20 s) until a profile of `pid` in `dir` names `function`.
fn wait_for_profile_naming(dir: &Path, pid: u32, function: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let profiles = profiles_of(dir, pid).unwrap_or_default();
        if frame_names(&profiles)
            .iter()
            .any(|name| name.contains(function))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("no profile of {pid} names {function}");
}

/// The account of programs no one else runs as.
const NOBODY: User = User {
    uid: 65534,
    gid: 65534,
};

/// Unwind rows a crafted library carries, about: 6 blocks of the BPF table (388 KiB with its
/// index).
const ROWS_PER_LIBRARY: usize = 96_000;

/// `count` shared libraries, each one function with [`ROWS_PER_LIBRARY`] distinct unwind rows
/// (and a different count each, so that no two share a table).
fn libraries_with_many_rows(dir: &Path, count: usize) -> Vec<PathBuf> {
    (0..count)
        .map(|index| {
            let source = dir.join(format!("rows{index}.s"));
            let pairs = ROWS_PER_LIBRARY / 2 + index;
            std::fs::write(
                &source,
                format!(
                    "\t.text\n\t.globl rows_{index}\n\t.type rows_{index}, @function\n\
                     rows_{index}:\n\t.cfi_startproc\n\t.rept {pairs}\n\tpush %rax\n\
                     \t.cfi_adjust_cfa_offset 8\n\tpop %rax\n\t.cfi_adjust_cfa_offset -8\n\
                     \t.endr\n\tret\n\t.cfi_endproc\n\t.section .note.GNU-stack,\"\",@progbits\n"
                ),
            )
            .expect("source written");
            let library = dir.join(format!("librows{index}.so"));
            let status = Command::new("gcc")
                .args(["-shared", "-nostdlib", "-o"])
                .arg(&library)
                .arg(&source)
                .status()
                .expect("gcc");
            assert!(status.success());
            library
        })
        .collect()
}

/// Share of `pid`'s samples, in its profiles after the first `skip`, whose stack has a frame for
/// which `matches` holds; and how many samples that was.
fn share_of_samples(
    dir: &Path,
    pid: u32,
    skip: usize,
    matches: impl Fn(&str) -> bool,
) -> (f64, i64) {
    let mut profiles = profiles_of(dir, pid).expect("profiles");
    profiles.sort_by(|a, b| a.0.cmp(&b.0));
    let (mut hit, mut total) = (0i64, 0i64);
    for (_, profile) in profiles.iter().skip(skip) {
        for sample in &profile.sample {
            total += count(sample);
            if sample_frames(profile, sample)
                .iter()
                .any(|frame| matches(&frame.name))
            {
                hit += count(sample);
            }
        }
    }
    (hit as f64 / total.max(1) as f64, total)
}

/// Item 4: one light process of a user `dlopen`s libraries whose unwind tables would take more
/// than the whole table budget. A program a third user starts after it (Debian's python3, built
/// without frame pointers) must still get its tables: its stacks reach `__libc_start_main`.
#[test]
fn a_process_hoarding_libraries_leaves_other_users_their_unwind_tables() {
    let user = unprivileged_user();
    // Built before the daemon runs: the attack itself must fit in the run. 40 libraries of
    // 388 KiB of tables would take 15 MiB, past the scenario's whole 12 MiB: alone, the hoarder
    // may pass its half (share by need), and python3's tables must take their room back.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let libraries = libraries_with_many_rows(dir.path(), 40);
    let hoarder = compile_c_with("library_hoarder.c", dir.path(), &["-O1"]).expect("gcc");
    make_readable(dir.path());
    let (scenario, baseline) = scenario();
    let (attacked, (python_pid, hoarder_pid, _running)) = scenario.run(|_: &AttackContext| {
        let hoarding = Workload::spawn(user.command(&hoarder).args(&libraries)).expect("starts");
        // Its tables are built and loaded once it has been sampled.
        std::thread::sleep(Duration::from_secs(5));
        // Another user again: root's share is the host's busy processes'.
        let python = Workload::spawn(NOBODY.command("/usr/bin/python3").args([
            "-c",
            "import json\nwhile True:\n    json.loads(json.dumps([{'k': i} for i in range(500)]))\n",
        ]))
        .expect("python3 starts");
        (python.pid(), hoarding.pid(), vec![hoarding, python])
    });
    attacked.assert_unharmed(baseline);
    // The hoarder is told, once, that some of its files got no table, and why.
    let told: Vec<&str> = attacked
        .log
        .lines()
        .filter(|line| {
            line.contains("got no unwind table") && line.contains(&format!("pid={hoarder_pid} "))
        })
        .collect();
    assert_eq!(told.len(), 1, "the hoarder's log lines: {told:?}");
    assert!(
        told[0].contains("user_share") || told[0].contains("budget"),
        "{}",
        told[0]
    );
    // Its first 4 s (two intervals) may be walked by frame pointers while its tables are built,
    // as for any program the daemon meets for the first time.
    let (rooted, samples) =
        share_of_samples(&attacked.output.join("profiles"), python_pid, 2, |name| {
            name.starts_with("__libc_start_main")
        });
    println!(
        "python3 beside the hoarder, after its first 4 s: {:.2}% of {samples} samples reach \
         __libc_start_main",
        rooted * 100.0
    );
    assert!(samples > 150, "too few python3 samples: {samples}");
    assert!(
        rooted >= 0.99,
        "only {rooted:.4} of python3's stacks are rooted"
    );
}
