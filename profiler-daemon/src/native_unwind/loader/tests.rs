use std::collections::HashMap as StdHashMap;

use profiler_common::cfi::{
    find_cfi_mapping, find_cfi_row, find_cfi_row_in_table, CfiRow, Transparent,
};

use super::*;

/// Tables with build time unbounded (the share is tested on its own).
fn unwind_tables(budget_bytes: u64, stats: Arc<TableStats>) -> UnwindTables<FakeMaps> {
    let mut tables = UnwindTables::new(FakeMaps::default(), budget_bytes, stats);
    tables.build_shares.share = Duration::MAX;
    tables
}

/// The maps, in memory.
#[derive(Default)]
struct FakeMaps {
    tables: StdHashMap<u32, (Box<CfiTableIndex>, Vec<Box<CfiBlock>>)>,
    procs: StdHashMap<u32, Box<CfiProcess>>,
}

impl TableMaps for FakeMaps {
    fn put_table(&mut self, id: u32, table: &TableBlocks) -> Result<(), String> {
        let blocks = table.blocks.iter().map(|b| Box::new(**b)).collect();
        self.tables.insert(id, (Box::new(*table.index), blocks));
        Ok(())
    }

    fn remove_table(&mut self, id: u32, _blocks: u32) {
        self.tables.remove(&id);
    }

    fn put_process(&mut self, pid: u32, process: &CfiProcess) -> Result<(), String> {
        self.procs.insert(pid, Box::new(*process));
        Ok(())
    }

    fn remove_process(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    fn has_process(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }
}

impl FakeMaps {
    /// The row the BPF walker would find for `pc` in process `pid`.
    fn row(&self, pid: u32, pc: u64) -> Option<CfiRow> {
        let mapping = find_cfi_mapping(self.procs.get(&pid)?, pc, &mut Transparent)?;
        let (index, blocks) = self.tables.get(&mapping.table)?;
        let address = u32::try_from(pc - mapping.bias).ok()?;
        find_cfi_row_in_table(index, address, &mut Transparent, |b| {
            blocks.get(b as usize).map(|b| &**b)
        })
    }
}

/// libc's own table, searched directly, at the ELF address of `getpid`.
fn libc_row_at(address: u64) -> CfiRow {
    let path = std::fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
    let data = std::fs::read(path).expect("libc readable");
    let table = build_table(&*data, BuildLimits::default()).expect("libc table");
    find_cfi_row(table.rows.len() as u32, address as u32, |i| {
        table.rows.get(i as usize).copied()
    })
    .expect("a row for getpid")
}

fn getpid_elf_address() -> u64 {
    let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
    let file = object::File::parse(&*data).expect("ELF");
    object::Object::dynamic_symbols(&file)
        .find(|s| object::ObjectSymbol::name(s) == Ok("getpid"))
        .map(|s| object::ObjectSymbol::address(&s))
        .expect("getpid in .dynsym")
}

#[test]
fn a_process_gets_its_files_tables_and_the_walker_finds_libc_rows() {
    let stats = Arc::new(TableStats::default());
    let mut tables = unwind_tables(256 << 20, stats.clone());
    let pid = std::process::id();
    tables.observe(pid);
    let entry = tables.maps.procs.get(&pid).expect("our entry");
    assert!(
        entry.count >= 2,
        "libc and the test binary: {}",
        entry.count
    );
    let starts: Vec<u64> = entry.mappings[..entry.count as usize]
        .iter()
        .map(|m| m.start)
        .collect();
    assert!(starts.windows(2).all(|w| w[0] < w[1]), "sorted");

    // Our getpid's address maps to the row libc's table has at its ELF address.
    let getpid = libc::getpid as *const () as u64;
    let found = tables.maps.row(pid, getpid).expect("a row for our getpid");
    assert_eq!(found, libc_row_at(getpid_elf_address()));

    // Seen again unchanged: nothing is built again.
    let builds = stats.builds.load(Ordering::Relaxed);
    tables.observe(pid);
    assert_eq!(stats.builds.load(Ordering::Relaxed), builds);
    assert_eq!(stats.processes.load(Ordering::Relaxed), 1);
    assert!(stats.bytes.load(Ordering::Relaxed) > 0);

    // The kernel dropped the entry (an exec): loaded again from the tables already built.
    tables.maps.remove_process(pid);
    tables.observe(pid);
    assert!(tables.maps.has_process(pid));
    assert_eq!(stats.builds.load(Ordering::Relaxed), builds);
}

/// The vDSO is no file: our `[vdso]` mapping gets the table of the host's image, and the row the
/// walker finds at `__vdso_clock_gettime` is the image's own table's row at that function.
#[test]
fn the_vdso_mapping_gets_the_host_images_table() {
    let stats = Arc::new(TableStats::default());
    let mut tables = unwind_tables(256 << 20, stats);
    let pid = std::process::id();
    tables.observe(pid);
    let mappings = crate::process::read_mappings(pid).expect("our mappings");
    let vdso = mappings
        .iter()
        .find(|m| matches!(m.backing, crate::process::Backing::Vdso))
        .expect("a vDSO mapping");
    let image = crate::vdso::VdsoImage::of_this_host().expect("the vDSO image");
    let elf = object::File::parse(image.bytes()).expect("ELF");
    let clock_gettime = object::Object::dynamic_symbols(&elf)
        .find(|s| object::ObjectSymbol::name(s) == Ok("__vdso_clock_gettime"))
        .map(|s| object::ObjectSymbol::address(&s))
        .expect("__vdso_clock_gettime");
    let table = build_table(image.bytes(), BuildLimits::default()).expect("the vDSO's table");
    // A few bytes into the function: past its first instruction, where the rule changes.
    for offset in [0, 1, 4, 8] {
        let address = clock_gettime + offset;
        let expected = find_cfi_row(table.rows.len() as u32, address as u32, |i| {
            table.rows.get(i as usize).copied()
        });
        let found = tables.maps.row(pid, vdso.start + address);
        assert!(found.is_some(), "a row at __vdso_clock_gettime+{offset}");
        assert_eq!(found, expected, "__vdso_clock_gettime+{offset}");
    }
}

#[test]
fn tables_past_the_budget_are_not_loaded_and_counted() {
    let stats = Arc::new(TableStats::default());
    // Less room than one 64 KiB block: libc (2 blocks and their index) does not fit.
    let mut tables = unwind_tables(40 << 10, stats.clone());
    tables.observe(std::process::id());
    // libc is more than the whole budget, and so more than our share of it.
    assert!(stats.not_loaded(NotLoaded::Budget) + stats.not_loaded(NotLoaded::UserShare) > 0);
    assert!(stats.bytes.load(Ordering::Relaxed) <= 40 << 10);
    let getpid = libc::getpid as *const () as u64;
    assert!(tables.maps.row(std::process::id(), getpid).is_none());
}

/// A process whose tables do not all fit keeps the ones it took first: it never evicts its own
/// tables to make room for its next ones (a process of 40 libraries did, and ended with tables
/// for none of its mappings but the last few).
#[test]
fn a_process_past_the_budget_keeps_the_tables_it_took() {
    let pid = std::process::id();
    let stats = Arc::new(TableStats::default());
    let mut tables = unwind_tables(1 << 30, stats.clone());
    tables.observe(pid);
    let all = stats.bytes.load(Ordering::Relaxed);
    let count = stats.tables.load(Ordering::Relaxed);
    assert!(
        count >= 3,
        "this test's binary, libc and ld.so have tables: {count}"
    );

    let stats = Arc::new(TableStats::default());
    let mut tables = unwind_tables(all - 1, stats.clone());
    tables.observe(pid);
    assert_eq!(stats.evictions.load(Ordering::Relaxed), 0);
    let loaded = stats.tables.load(Ordering::Relaxed);
    assert!(loaded > 0 && loaded < count, "{loaded} of {count} tables");
    assert!(stats.not_loaded(NotLoaded::Budget) + stats.not_loaded(NotLoaded::UserShare) > 0);
    // Every table loaded is one the process's entry names.
    let entry = tables.maps.procs.get(&pid).expect("the entry");
    assert_eq!(entry.count as u64, loaded);
    assert!(tables.maps.tables.len() as u64 == loaded);
}

#[test]
fn unused_tables_are_evicted_least_recently_used_first() {
    let stats = Arc::new(TableStats::default());
    let mut tables = unwind_tables(256 << 20, stats.clone());
    let pid = std::process::id();
    tables.observe(pid);
    let loaded = stats.tables.load(Ordering::Relaxed);
    assert!(loaded >= 2);
    // The process goes away: its tables stay, unused, until room is needed.
    tables.forget(pid);
    assert_eq!(stats.tables.load(Ordering::Relaxed), loaded);
    assert!(tables.make_room(tables.budget_bytes, None));
    assert_eq!(stats.tables.load(Ordering::Relaxed), 0);
    assert_eq!(stats.evictions.load(Ordering::Relaxed), loaded);
    assert!(tables.maps.tables.is_empty());
}

/// A process of another user than this test's (root): `sleep 30` as `nobody`.
fn sleep_as_nobody() -> std::process::Child {
    use std::os::unix::process::CommandExt as _;
    std::process::Command::new("sleep")
        .arg("30")
        .uid(65534)
        .gid(65534)
        .spawn()
        .expect("sleep as nobody (the tests run as root)")
}

/// A user alone may hold more than half the budget (share by need), and another user's program
/// started later still gets its tables, taken from the user holding most.
#[test]
fn one_users_tables_leave_another_users_their_share() {
    // `nobody` runs a program with few tables; root (this test) holds many.
    let mut other = sleep_as_nobody();
    std::thread::sleep(Duration::from_millis(100));
    let bytes_alone = |pid: u32| {
        let stats = Arc::new(TableStats::default());
        let mut tables = unwind_tables(1 << 30, stats.clone());
        tables.observe(pid);
        stats.bytes.load(Ordering::Relaxed)
    };
    let ours = bytes_alone(std::process::id());
    let theirs = bytes_alone(other.id());
    assert!(
        theirs > 0 && ours > 2 * theirs,
        "ours {ours}, theirs {theirs}"
    );
    // Half the budget is less than what we would take, and more than what they need.
    let budget = ours.max(2 * theirs + (64 << 10));

    let stats = Arc::new(TableStats::default());
    let mut tables = unwind_tables(budget, stats.clone());
    tables.observe(std::process::id());
    let held = stats.bytes.load(Ordering::Relaxed);
    assert!(
        held > user_share(budget),
        "alone, we hold more than half: {held} of {budget}"
    );
    tables.observe(other.id());
    assert!(
        stats.evictions.load(Ordering::Relaxed) > 0,
        "their room was taken from us"
    );
    let _ = other.kill();
    let _ = other.wait();
    let entry = tables.maps.procs.get(&other.id()).expect("their entry");
    assert!(
        entry.count >= 3,
        "sleep, libc and ld.so all have tables: {}",
        entry.count
    );
    assert_eq!(stats.not_loaded(NotLoaded::Budget), 0);
}

/// A user whose build time for the window is spent gets no more tables built now: the process
/// is left incomplete and continued at the user's next turn.
#[test]
fn a_process_whose_users_build_time_is_spent_is_completed_at_its_next_turn() {
    let stats = Arc::new(TableStats::default());
    let mut tables = unwind_tables(256 << 20, stats.clone());
    tables.build_shares.share = Duration::ZERO;
    // Another user's process waits for its turn too: turns are taken only while someone waits.
    let mut other = sleep_as_nobody();
    tables.processes.insert(
        other.id(),
        LoadedProcess {
            start_time: 0,
            complete: false,
            uid: 65534,
            mappings: Vec::new(),
            tables: Vec::new(),
        },
    );
    let pid = std::process::id();
    tables.observe(pid);
    // At most the vDSO's, which is every process's and no user's.
    let vdso_only = stats.builds.load(Ordering::Relaxed);
    assert!(vdso_only <= 1, "no file's table built: {vdso_only}");
    assert!(tables.processes.get(&pid).is_some_and(|p| !p.complete));
    // Still spent: nothing happens.
    tables.continue_incomplete();
    assert_eq!(stats.builds.load(Ordering::Relaxed), vdso_only);
    // The next turn: the process gets its tables.
    tables.build_shares.share = Duration::MAX;
    tables.continue_incomplete();
    let _ = other.kill();
    let _ = other.wait();
    assert!(stats.builds.load(Ordering::Relaxed) >= vdso_only + 2);
    assert!(tables.processes.get(&pid).is_some_and(|p| p.complete));
    let getpid = libc::getpid as *const () as u64;
    assert!(tables.maps.row(pid, getpid).is_some());
}

/// Alone, a user's spent build time defers nothing: a build's big libraries get their tables
/// one after the other, not one per window.
#[test]
fn a_user_alone_is_not_kept_waiting_for_a_turn() {
    let stats = Arc::new(TableStats::default());
    let mut tables = unwind_tables(256 << 20, stats.clone());
    tables.build_shares.share = Duration::ZERO;
    let pid = std::process::id();
    tables.observe(pid);
    assert!(tables.processes.get(&pid).is_some_and(|p| p.complete));
    assert!(stats.builds.load(Ordering::Relaxed) >= 2);
    let getpid = libc::getpid as *const () as u64;
    assert!(tables.maps.row(pid, getpid).is_some());
}
