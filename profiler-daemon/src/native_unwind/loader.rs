//! Keeps the BPF side's native unwind tables current, on a thread of its own ("unwind-tables"):
//! the sampling loop tells it which processes were sampled, and it loads, for each, the tables of
//! the files its executable mappings hold, and the mappings themselves (`CFI_PROCS`).
//!
//! - **Shared.** A table is built once per distinct unwind input ([`TableKeys`]) and used by
//!   every process that maps such a file; files are recognised by device, inode, size and
//!   modification time, so a file seen before is not read again.
//! - **Bounded.** Tables live under a memory budget (a share of `cache_budget_mib`); when a new
//!   one does not fit, the least recently used tables no live process uses are evicted, and if
//!   that is not enough the new one is not loaded (its code falls back to frame pointers), and
//!   counted. Each file's reads and rows are bounded too ([`BuildLimits`], [`MAX_READ_BYTES`]).
//! - **Shared by need, fairly.** The processes of one user are sure to keep half of the budget
//!   ([`user_share`]) and may hold more while no other user's tables need the room (one big
//!   program, a compiler's 10 MiB of tables, is not cut off at half); when the budget is full a
//!   user holding less takes room from the user holding most, even tables in use (those
//!   mappings fall back to frame pointers): a user who maps hundreds of libraries cannot keep
//!   another user's programs from getting their tables. Building takes turns too: a user's
//!   processes get [`BUILD_SHARE`] of this thread's time per [`BUILD_WINDOW`] while another
//!   user's process waits, and a process whose tables wait for its user's next turn is
//!   completed then (at once when nobody else waits), so one user's hundred new libraries
//!   never hold up another user's program.
//! - **Never in the way.** Building runs here, never on the sampling loop; samples taken before a
//!   process's tables are loaded are walked by frame pointers. A process that execs or exits
//!   loses its entry in the kernel at once (`process_events.rs`); this thread notices the
//!   missing entry, or changed mappings (a library loaded later), at the process's next sample
//!   report and loads it again.

use std::os::unix::fs::MetadataExt as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData};
use hashbrown::HashMap;
use object::read::ReadCache;
use object::ReadRef;
use profiler_common::cfi::{cfi_block_key, CfiBlock, CfiMapping, CfiProcess, CfiTableIndex};
use profiler_common::cfi::{MAX_CFI_BLOCKS, MAX_CFI_MAPPINGS};
use profiler_unwind_tables::{
    build_table, split_into_blocks, BuildError, BuildLimits, TableBlocks,
};

use super::mapping::{load_bias_in, load_segments, CodeMapping, LoadSegment, TableKey, TableKeys};
use crate::process::{self, Backing, Mapping};
use crate::process_key::ProcessKey;
use crate::untrusted::BoundedReads;
use crate::user_time::UserTimeShares;
use crate::vdso::VdsoImage;

/// Most bytes read from one file to key and build its table (headers and `.eh_frame`; a
/// 130 MB `librustc_driver` has 14 MB of `.eh_frame`).
pub const MAX_READ_BYTES: u64 = 128 << 20;

/// How often processes known to have tables are checked for having exited.
const LIVENESS_PERIOD: Duration = Duration::from_secs(10);

/// How long a table that did not fit the budget, or a file that could not be read, waits before
/// it is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Time this thread spends building tables for one user's processes per [`BUILD_WINDOW`] (a
/// table is never cut short: a user may pass it by one table).
pub const BUILD_SHARE: Duration = Duration::from_millis(500);
pub const BUILD_WINDOW: Duration = Duration::from_secs(5);

/// Files not mapped by any process seen for this long are forgotten.
const FORGET_FILES_AFTER: Duration = Duration::from_secs(600);

/// The share of `cache_budget_mib` given to unwind tables: half (the rest is the symbolization
/// caches'). 48 MiB of the default 96 hold a compiler's tables (rustc's libLLVM and
/// librustc_driver, 10.5 MiB) four times over beside a JVM host's (libjvm, 0.8 MiB).
pub fn table_budget(cache_budget_bytes: u64) -> u64 {
    cache_budget_bytes / 2
}

/// The table bytes the processes of one user are sure to keep: half the budget. A user may hold
/// more while the budget has room no other user's tables need (share by need); past this, those
/// tables are the first taken when another user needs room (`fair_share_victim`).
pub fn user_share(table_budget_bytes: u64) -> u64 {
    table_budget_bytes / 2
}

/// The bounds of one file's table: what the maps can hold.
pub fn build_limits() -> BuildLimits {
    BuildLimits {
        max_rows: MAX_CFI_BLOCKS * profiler_common::cfi::CFI_BLOCK_ROWS,
    }
}

/// `CFI_BLOCKS`' capacity for a table budget.
pub fn block_capacity(table_budget_bytes: u64) -> u32 {
    (table_budget_bytes / std::mem::size_of::<CfiBlock>() as u64).clamp(1, u32::MAX as u64) as u32
}

profiler_common::labelled_enum! {
    /// Why a file's mapping got no table.
    pub enum NotLoaded {
        /// No `.eh_frame` or `.debug_frame`, or not x86_64 ELF.
        NoCfi => "no_cfi",
        /// The file could not be opened or read safely, or its call frame information is broken.
        Unreadable => "unreadable",
        /// More rows than a table may have.
        TooLarge => "too_large",
        /// The budget was full of tables live processes use.
        Budget => "budget",
        /// The kernel refused a map update (a map full, memory).
        MapFull => "map_full",
        /// The process has more mappings with tables than its entry holds.
        TooManyMappings => "too_many_mappings",
        /// Its user's processes already hold their share of the budget ([`user_share`]).
        UserShare => "user_share",
    }
}

/// The file-backed ones among a process's executable mappings (the others have no table).
fn file_backed(mappings: &[Mapping]) -> Vec<&Mapping> {
    mappings
        .iter()
        .filter(|m| matches!(m.backing, Backing::File { .. }))
        .collect()
}

/// What identifies a process's file mappings: their ranges and offsets.
fn signature_of(files: &[&Mapping]) -> Vec<(u64, u64, u64)> {
    files.iter().map(|m| (m.start, m.end, m.offset)).collect()
}

/// The signature of `pid`'s file mappings now, if it is readable.
fn file_mappings(pid: u32) -> Option<Vec<(u64, u64, u64)>> {
    let mappings = process::read_mappings(pid).ok()?;
    Some(signature_of(&file_backed(&mappings)))
}

/// Adds `mapping` to `process`'s mappings, kept sorted by address (the BPF side searches them).
fn insert_sorted(process: &mut CfiProcess, mapping: CfiMapping) {
    let count = process.count as usize;
    if count >= MAX_CFI_MAPPINGS {
        return;
    }
    let at = process.mappings[..count].partition_point(|m| m.start < mapping.start);
    process.mappings.copy_within(at..count, at + 1);
    process.mappings[at] = mapping;
    process.count += 1;
}

/// Figures shared with the metrics endpoint.
#[derive(Debug, Default)]
pub struct TableStats {
    pub tables: AtomicU64,
    pub bytes: AtomicU64,
    pub limit_bytes: AtomicU64,
    pub processes: AtomicU64,
    pub builds: AtomicU64,
    pub build_micros: AtomicU64,
    pub evictions: AtomicU64,
    pub not_loaded: [AtomicU64; NotLoaded::ALL.len()],
}

impl TableStats {
    fn count(&self, reason: NotLoaded) {
        self.not_loaded[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn not_loaded(&self, reason: NotLoaded) -> u64 {
        self.not_loaded[reason as usize].load(Ordering::Relaxed)
    }
}

/// The BPF maps the tables go to (a fake in tests).
pub trait TableMaps {
    /// Writes a table's blocks, then its index (a walk that finds the index finds its blocks).
    fn put_table(&mut self, id: u32, table: &TableBlocks) -> Result<(), String>;
    fn remove_table(&mut self, id: u32, blocks: u32);
    fn put_process(&mut self, pid: u32, process: &CfiProcess) -> Result<(), String>;
    fn remove_process(&mut self, pid: u32);
    /// Whether the kernel still has the process's entry (it drops it on exec and exit).
    fn has_process(&self, pid: u32) -> bool;
}

/// The sampler's `CFI_PROCS`, `CFI_TABLES` and `CFI_BLOCKS`.
pub struct BpfTableMaps {
    pub procs: BpfHashMap<MapData, u32, CfiProcess>,
    pub tables: BpfHashMap<MapData, u32, CfiTableIndex>,
    pub blocks: BpfHashMap<MapData, u64, CfiBlock>,
}

impl TableMaps for BpfTableMaps {
    // Blocks are 64 KiB and indexes 4 KiB: borrowed, not copied onto the stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    fn put_table(&mut self, id: u32, table: &TableBlocks) -> Result<(), String> {
        for (number, block) in table.blocks.iter().enumerate() {
            if let Err(err) = self
                .blocks
                .insert(cfi_block_key(id, number as u32), &**block, 0)
            {
                self.remove_table(id, number as u32);
                return Err(err.to_string());
            }
        }
        if let Err(err) = self.tables.insert(id, &*table.index, 0) {
            self.remove_table(id, table.blocks.len() as u32);
            return Err(err.to_string());
        }
        Ok(())
    }

    fn remove_table(&mut self, id: u32, blocks: u32) {
        let _ = self.tables.remove(&id);
        for number in 0..blocks {
            let _ = self.blocks.remove(&cfi_block_key(id, number));
        }
    }

    fn put_process(&mut self, pid: u32, process: &CfiProcess) -> Result<(), String> {
        self.procs
            .insert(pid, process, 0)
            .map_err(|err| err.to_string())
    }

    fn remove_process(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
    }

    fn has_process(&self, pid: u32) -> bool {
        self.procs.get(&pid, 0).is_ok()
    }
}

/// A file as the host knows it: equal ids, same bytes (unless rewritten in place within the
/// same second, which `mtime`'s nanoseconds make unlikely).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FileId {
    dev: u64,
    inode: u64,
    size: u64,
    mtime_ns: i128,
}

/// What a file's headers said: the key of its table and its loadable segments.
struct FileLayout {
    key: Option<TableKey>,
    segments: Vec<LoadSegment>,
    last_used: Instant,
}

impl FileLayout {
    /// The table key, and the load bias of `mapping` of this file; `None` if the file has no
    /// table or the mapping lies outside its loadable segments.
    fn placed_at(&self, mapping: &Mapping) -> Option<(TableKey, u64)> {
        let bias = load_bias_in(
            &self.segments,
            CodeMapping {
                start: mapping.start,
                end: mapping.end,
                file_offset: mapping.offset,
            },
        )?;
        Some((self.key?, bias))
    }
}

enum TableState {
    Loaded(LoadedTable),
    /// Built once and found larger than what its requester's share left: refused without
    /// building again to users who cannot hold `bytes` more, until `retry`.
    OverShare {
        bytes: u64,
        retry: Instant,
    },
    /// Not loaded; tried again after `retry` (never for what cannot change).
    Failed {
        retry: Option<Instant>,
        reason: NotLoaded,
    },
}

struct LoadedTable {
    id: u32,
    blocks: u32,
    bytes: u64,
    /// Processes whose entry uses it.
    users: u32,
    last_used: Instant,
}

/// A mapping's table, as [`UnwindTables::table_of`] found it.
struct MappedTable {
    id: u32,
    bias: u64,
    key: TableKey,
    /// Built for this mapping (the process's entry is then written at once).
    built: bool,
}

impl MappedTable {
    /// The process entry's record of `mapping` with this table.
    fn entry_for(&self, mapping: &Mapping) -> CfiMapping {
        CfiMapping {
            start: mapping.start,
            end: mapping.end,
            bias: self.bias,
            table: self.id,
            _reserved: 0,
        }
    }
}

/// What the processes of one user hold of the table budget, while a process of theirs is
/// loaded: the distinct tables they use and their bytes.
struct UserHoldings {
    uid: u32,
    tables: hashbrown::HashSet<TableKey>,
    bytes: u64,
    /// A table of the process being loaded was left for later: its user's build time for this
    /// window was spent.
    deferred: bool,
}

impl UserHoldings {
    fn add(&mut self, key: TableKey, bytes: u64) {
        if self.tables.insert(key) {
            self.bytes += bytes;
        }
    }
}

/// A process whose entry is in `CFI_PROCS`.
struct LoadedProcess {
    start_time: u64,
    /// All its tables were tried (none waits for its user's next turn to be built).
    complete: bool,
    /// Its owner: whose share of the budget its tables count against.
    uid: u32,
    /// Its file-backed executable mappings when loaded: reloaded when they change.
    mappings: Vec<(u64, u64, u64)>,
    tables: Vec<TableKey>,
}

pub struct UnwindTables<M: TableMaps> {
    maps: M,
    keys: TableKeys,
    limits: BuildLimits,
    budget_bytes: u64,
    used_bytes: u64,
    build_shares: UserTimeShares,
    files: HashMap<FileId, FileLayout>,
    tables: HashMap<TableKey, TableState>,
    processes: HashMap<u32, LoadedProcess>,
    /// The id the next table gets. Ids are never reused: the BPF walkers' per-CPU row caches
    /// (`profiler_common::cfi::CfiRowCache`) trust a row found for (table id, address) for as
    /// long as they hold it, so an id must always name the same rows.
    next_id: u32,
    /// The host's vDSO image's table key and segments (`None`: it has no usable CFI).
    vdso: Option<FileLayout>,
    stats: Arc<TableStats>,
    /// Why mappings of the process being observed got no table.
    refused_now: Vec<NotLoaded>,
    /// The tables the process being observed has taken so far: in use, though its `users` count
    /// only once the process is written (a process of many libraries evicted its own first
    /// tables to make room for its last ones).
    taken_now: hashbrown::HashSet<TableKey>,
    /// Processes (pid, start time) whose missing tables were logged: once each.
    told: hashbrown::HashSet<(u32, u64)>,
}

impl<M: TableMaps> UnwindTables<M> {
    pub fn new(maps: M, budget_bytes: u64, stats: Arc<TableStats>) -> Self {
        stats.limit_bytes.store(budget_bytes, Ordering::Relaxed);
        let keys = TableKeys::new();
        let vdso = VdsoImage::of_this_host().and_then(|image| {
            let elf = object::File::parse(image.bytes()).ok()?;
            Some(FileLayout {
                key: Some(keys.key(&elf)?),
                segments: load_segments(&elf),
                last_used: Instant::now(),
            })
        });
        Self {
            maps,
            keys,
            limits: build_limits(),
            budget_bytes,
            used_bytes: 0,
            build_shares: UserTimeShares::new(BUILD_SHARE, BUILD_WINDOW),
            files: HashMap::new(),
            tables: HashMap::new(),
            processes: HashMap::new(),
            next_id: 1,
            vdso,
            stats,
            refused_now: Vec::new(),
            taken_now: hashbrown::HashSet::new(),
            told: hashbrown::HashSet::new(),
        }
    }

    /// Runs until the sending side is dropped: loads the processes reported, and checks those
    /// it knows for having exited every [`LIVENESS_PERIOD`].
    pub fn run(mut self, sampled: Receiver<Vec<u32>>) {
        let mut checked = Instant::now();
        loop {
            // A process left incomplete is continued at its user's next turn, not at its next
            // sample report (an interval later).
            let wait = if self.processes.values().any(|p| !p.complete) {
                Duration::from_secs(1)
            } else {
                LIVENESS_PERIOD
            };
            match sampled.recv_timeout(wait) {
                Ok(mut pids) => {
                    pids.extend(sampled.try_iter().flatten());
                    pids.sort_unstable();
                    pids.dedup();
                    for pid in pids {
                        self.observe_guarded(pid);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.continue_incomplete();
            if checked.elapsed() >= LIVENESS_PERIOD {
                checked = Instant::now();
                self.forget_exited();
            }
        }
    }

    /// Observes again the processes whose tables waited for their user's next turn, if it has
    /// come, or if no other user's process waits (turns are for sharing this thread, not for
    /// leaving it idle: a build's big libraries get their tables within a second or two).
    fn continue_incomplete(&mut self) {
        let waiting: Vec<(u32, u32)> = self
            .processes
            .iter()
            .filter(|(_, process)| !process.complete)
            .map(|(pid, process)| (*pid, process.uid))
            .collect();
        for (pid, uid) in waiting {
            if self.build_shares.allows(uid) || !self.others_wait(uid) {
                self.observe_guarded(pid);
            }
        }
    }

    /// Whether a process of another user than `uid` waits for its user's turn to build.
    fn others_wait(&self, uid: u32) -> bool {
        self.processes
            .values()
            .any(|process| !process.complete && process.uid != uid)
    }

    /// Bytes free in the budget, counting tables no process uses as free (they are evicted
    /// first): what a user past their share may still take.
    fn room_without_others(&self) -> u64 {
        let unused: u64 = self
            .tables
            .iter()
            .filter_map(|(key, state)| match state {
                TableState::Loaded(table) if table.users == 0 && !self.taken_now.contains(key) => {
                    Some(table.bytes)
                }
                _ => None,
            })
            .sum();
        (self.budget_bytes + unused).saturating_sub(self.used_bytes)
    }

    /// [`Self::observe`], a panic costing this process's tables rather than the thread.
    fn observe_guarded(&mut self, pid: u32) {
        let observed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.observe(pid)));
        if observed.is_err() {
            self.taken_now.clear();
            tracing::error!(
                pid,
                "building unwind tables panicked (a bug; please report it with the log above): \
                 this process is walked by frame pointers"
            );
            self.forget(pid);
        }
    }

    /// A process was sampled: loads its tables and mappings unless they are current.
    pub fn observe(&mut self, pid: u32) {
        self.load_process(pid);
        self.taken_now.clear();
    }

    fn load_process(&mut self, pid: u32) {
        let Ok(stat) = process::read_stat(pid) else {
            self.forget(pid);
            return;
        };
        let Ok(mappings) = process::read_mappings(pid) else {
            self.forget(pid);
            return;
        };
        let mut files = file_backed(&mappings);
        let signature = signature_of(&files);
        if let Some(known) = self.processes.get(&pid) {
            if known.start_time == stat.starttime
                && known.complete
                && known.mappings == signature
                && self.maps.has_process(pid)
            {
                let now = Instant::now();
                for key in &known.tables {
                    if let Some(TableState::Loaded(table)) = self.tables.get_mut(key) {
                        table.last_used = now;
                    }
                }
                return;
            }
        }
        self.forget(pid);
        self.refused_now.clear();
        let shares_our_root = process::shares_our_root(pid);
        let uid = process::owner_uid(pid).unwrap_or(u32::MAX);
        let mut holdings = self.holdings_of(uid);
        let mut entry = Box::new(CfiProcess {
            count: 0,
            _reserved: 0,
            mappings: [CfiMapping::default(); MAX_CFI_MAPPINGS],
        });
        let mut tables = Vec::new();
        // Small mappings first (their tables build fast), and the entry written after each
        // table built: a JNI library's frames need not wait for libjvm's table.
        files.sort_by_key(|m| m.end - m.start);
        for mapping in files {
            if entry.count as usize >= MAX_CFI_MAPPINGS {
                self.refuse(NotLoaded::TooManyMappings);
                break;
            }
            let Some(found) = self.table_of(pid, shares_our_root, mapping, &mut holdings) else {
                continue;
            };
            insert_sorted(&mut entry, found.entry_for(mapping));
            tables.push(found.key);
            self.taken_now.insert(found.key);
            if found.built && self.maps.put_process(pid, &entry).is_err() {
                break;
            }
        }
        // The vDSO is no file: its table is the host image's (see `crate::vdso`).
        let vdso = mappings.iter().find(|m| matches!(m.backing, Backing::Vdso));
        if let Some((mapping, found)) = vdso.and_then(|m| Some((m, self.vdso_table(m)?))) {
            if (entry.count as usize) < MAX_CFI_MAPPINGS {
                insert_sorted(&mut entry, found.entry_for(mapping));
                tables.push(found.key);
            }
        }
        self.tell_refused(pid, stat.starttime);
        if entry.count == 0 && !holdings.deferred {
            return;
        }
        // A process with no table yet (all wait for its user's next turn) is remembered, not
        // written: there is nothing to walk with.
        let written = if entry.count > 0 {
            self.maps.put_process(pid, &entry)
        } else {
            Ok(())
        };
        if let Err(err) = written {
            tracing::debug!(pid, %err, "unwind mappings not written");
            self.stats.count(NotLoaded::MapFull);
            self.maps.remove_process(pid);
            return;
        }
        // An exec while the tables were built: the kernel dropped the entry before it was
        // written, and the new program must not be walked with the old one's mappings.
        if file_mappings(pid).is_none_or(|now| now != signature) {
            self.maps.remove_process(pid);
            return;
        }
        for key in &tables {
            if let Some(TableState::Loaded(table)) = self.tables.get_mut(key) {
                table.users += 1;
            }
        }
        self.processes.insert(
            pid,
            LoadedProcess {
                start_time: stat.starttime,
                complete: !holdings.deferred,
                uid,
                mappings: signature,
                tables,
            },
        );
        self.publish();
    }

    /// Logs once per process why some of its files got no table (their frames are walked by
    /// frame pointers, and stacks through code without them end there); the counts are
    /// `profiler_unwind_tables_not_loaded_total{reason}`. Files without call frame information
    /// are the normal case, not told.
    fn tell_refused(&mut self, pid: u32, start_time: u64) {
        let mut reasons: Vec<&'static str> = self
            .refused_now
            .iter()
            .filter(|reason| **reason != NotLoaded::NoCfi)
            .map(|reason| reason.name())
            .collect();
        if reasons.is_empty() || !self.told.insert((pid, start_time)) {
            return;
        }
        reasons.sort_unstable();
        reasons.dedup();
        tracing::info!(
            pid,
            mappings = self.refused_now.len(),
            reasons = %reasons.join(","),
            "some of a process's files got no unwind table: its stacks through them are walked \
             by frame pointers"
        );
    }

    /// What the loaded processes of `uid` hold.
    fn holdings_of(&self, uid: u32) -> UserHoldings {
        let mut holdings = UserHoldings {
            uid,
            tables: hashbrown::HashSet::new(),
            bytes: 0,
            deferred: false,
        };
        for process in self.processes.values().filter(|p| p.uid == uid) {
            for key in &process.tables {
                if let Some(TableState::Loaded(table)) = self.tables.get(key) {
                    holdings.add(*key, table.bytes);
                }
            }
        }
        holdings
    }

    /// The table id, bias and key for one mapping, loading the table if needed and within the
    /// share of the user whose `holdings` are given.
    fn table_of(
        &mut self,
        pid: u32,
        shares_our_root: bool,
        mapping: &Mapping,
        holdings: &mut UserHoldings,
    ) -> Option<MappedTable> {
        let file = process::open_mapped_file(pid, shares_our_root, mapping).ok()?;
        let meta = file.metadata().ok()?;
        let Backing::File { dev, inode, .. } = mapping.backing else {
            return None;
        };
        let id = FileId {
            dev,
            inode,
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        };
        let now = Instant::now();
        let reads = BoundedReads::new(ReadCache::new(file), MAX_READ_BYTES);
        if !self.files.contains_key(&id) {
            let layout = match object::File::parse(&reads) {
                Ok(elf) => FileLayout {
                    key: self.keys.key(&elf),
                    segments: load_segments(&elf),
                    last_used: now,
                },
                Err(_) => FileLayout {
                    key: None,
                    segments: Vec::new(),
                    last_used: now,
                },
            };
            self.files.insert(id, layout);
        }
        let layout = self.files.get_mut(&id)?;
        layout.last_used = now;
        let (key, bias) = layout.placed_at(mapping)?;
        let found = self.load_mapped_table(key, bias, &reads, Some(holdings), &mapping.backing)?;
        Some(found)
    }

    /// The table of a process's `[vdso]` mapping: the host's image's (see `crate::vdso`), if the
    /// mapping holds that image.
    fn vdso_table(&mut self, mapping: &Mapping) -> Option<MappedTable> {
        let image = VdsoImage::of_this_host().filter(|image| image.is_mapped_by(mapping))?;
        let (key, bias) = self.vdso.as_ref()?.placed_at(mapping)?;
        self.load_mapped_table(key, bias, image.bytes(), None, &mapping.backing)
    }

    /// [`Self::load_table`], for a mapping whose pcs are `bias` from the table's addresses.
    fn load_mapped_table<'data, R: ReadRef<'data>>(
        &mut self,
        key: TableKey,
        bias: u64,
        data: R,
        holdings: Option<&mut UserHoldings>,
        backing: &Backing,
    ) -> Option<MappedTable> {
        let (id, built) = self.load_table(key, data, holdings, backing)?;
        Some(MappedTable {
            id,
            bias,
            key,
            built,
        })
    }

    /// The id of the table keyed `key`, built from `data` (a file's bounded reads, or the vDSO
    /// image) and loaded if it is not yet, and whether it was built now. A table already loaded
    /// is always given (it costs nothing more); a new one only within the user's share, when
    /// `holdings` says whose it is (the vDSO's is everyone's). `backing` names it in the log.
    fn load_table<'data, R: ReadRef<'data>>(
        &mut self,
        key: TableKey,
        data: R,
        mut holdings: Option<&mut UserHoldings>,
        backing: &Backing,
    ) -> Option<(u32, bool)> {
        let now = Instant::now();
        if let Some(TableState::Loaded(table)) = self.tables.get_mut(&key) {
            table.last_used = now;
            if let Some(holdings) = holdings {
                holdings.add(key, table.bytes);
            }
            return Some((table.id, false));
        }
        let share = user_share(self.budget_bytes);
        // A sum over the loaded tables: only for a table not loaded yet.
        let room = self.room_without_others();
        match self.tables.get(&key) {
            Some(TableState::Failed { retry, reason }) if retry.is_none_or(|at| now < at) => {
                // Counted when it failed; told again for this process.
                self.refused_now.push(*reason);
                return None;
            }
            Some(TableState::OverShare { bytes, retry })
                if now < *retry
                    && *bytes > room
                    && holdings.as_ref().is_some_and(|h| h.bytes + *bytes > share) =>
            {
                self.refuse(NotLoaded::UserShare);
                return None;
            }
            _ => {}
        }
        if let Some(holdings) = holdings.as_deref_mut() {
            if holdings.bytes >= share && room == 0 {
                // Not even built: a user past their share, in a budget other users' tables
                // fill, costs no more of this thread's time.
                self.refuse(NotLoaded::UserShare);
                return None;
            }
            if !self.build_shares.allows(holdings.uid) && self.others_wait(holdings.uid) {
                holdings.deferred = true;
                return None;
            }
        }
        let started = Instant::now();
        let built = build_table(data, self.limits);
        if let Some(holdings) = holdings.as_deref() {
            self.build_shares.charge(holdings.uid, started.elapsed());
        }
        self.stats.builds.fetch_add(1, Ordering::Relaxed);
        self.stats
            .build_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        let result = match built {
            Ok(table) => split_into_blocks(&table.rows).ok_or(NotLoaded::TooLarge),
            Err(BuildError::TooLarge { .. } | BuildError::AddressTooHigh { .. }) => {
                Err(NotLoaded::TooLarge)
            }
            Err(BuildError::NoCallFrameInfo | BuildError::NotX86_64) => Err(NotLoaded::NoCfi),
            Err(BuildError::Elf(_) | BuildError::Cfi(_)) => Err(NotLoaded::Unreadable),
        };
        let blocks = match result {
            Ok(blocks) => blocks,
            Err(reason) => {
                self.fail(key, reason, None);
                return None;
            }
        };
        let bytes = blocks.map_bytes();
        let over_share = holdings.as_ref().is_some_and(|h| h.bytes + bytes > share);
        if over_share && bytes > room {
            // Refused to this user, not to others who map it, who may hold it.
            self.refuse(NotLoaded::UserShare);
            self.tables.insert(
                key,
                TableState::OverShare {
                    bytes,
                    retry: now + RETRY_AFTER,
                },
            );
            return None;
        }
        // Past its share, a user takes only room no other user's tables hold.
        let requester = if over_share {
            None
        } else {
            holdings.as_deref()
        };
        if !self.make_room(bytes, requester) {
            self.fail(key, NotLoaded::Budget, Some(now + RETRY_AFTER));
            return None;
        }
        let Some(id) = self
            .next_id
            .checked_add(1)
            .map(|next| std::mem::replace(&mut self.next_id, next))
        else {
            // Four billion tables built: none is loaded again rather than reuse an id.
            self.fail(key, NotLoaded::MapFull, None);
            return None;
        };
        if let Err(err) = self.maps.put_table(id, &blocks) {
            tracing::debug!(%err, "unwind table not written");
            self.fail(key, NotLoaded::MapFull, Some(now + RETRY_AFTER));
            return None;
        }
        tracing::debug!(
            file = ?backing,
            blocks = blocks.index.blocks,
            bytes,
            took_ms = started.elapsed().as_millis() as u64,
            "unwind table loaded"
        );
        self.used_bytes += bytes;
        if let Some(holdings) = holdings {
            holdings.add(key, bytes);
        }
        self.tables.insert(
            key,
            TableState::Loaded(LoadedTable {
                id,
                blocks: blocks.index.blocks,
                bytes,
                users: 0,
                last_used: now,
            }),
        );
        self.publish();
        Some((id, true))
    }

    /// Counts a mapping left without a table, and notes it for the process being observed.
    fn refuse(&mut self, reason: NotLoaded) {
        self.stats.count(reason);
        self.refused_now.push(reason);
    }

    fn fail(&mut self, key: TableKey, reason: NotLoaded, retry: Option<Instant>) {
        self.refuse(reason);
        self.tables
            .insert(key, TableState::Failed { retry, reason });
    }

    /// Evicts tables until `bytes` more fit: the least recently used tables no process uses
    /// (nor the process being observed), then, for a `requester` (a user's holdings), tables of
    /// the user holding most, as long as that user would still hold more than the requester.
    fn make_room(&mut self, bytes: u64, requester: Option<&UserHoldings>) -> bool {
        while self.used_bytes + bytes > self.budget_bytes {
            let unused = self
                .tables
                .iter()
                .filter_map(|(key, state)| match state {
                    TableState::Loaded(table)
                        if table.users == 0 && !self.taken_now.contains(key) =>
                    {
                        Some((*key, table.last_used))
                    }
                    _ => None,
                })
                .min_by_key(|(_, last_used)| *last_used)
                .map(|(key, _)| key);
            let victim = unused.or_else(|| self.fair_share_victim(bytes, requester?));
            let Some(victim) = victim else {
                return false;
            };
            self.evict(victim);
        }
        true
    }

    /// The least recently used table of the user holding most, if that user would still hold
    /// more than `requester` with `bytes` more; never one the requester uses.
    fn fair_share_victim(&self, bytes: u64, requester: &UserHoldings) -> Option<TableKey> {
        let mut uids: Vec<u32> = self.processes.values().map(|p| p.uid).collect();
        uids.sort_unstable();
        uids.dedup();
        let largest = uids
            .into_iter()
            .filter(|uid| *uid != requester.uid)
            .map(|uid| self.holdings_of(uid))
            .max_by_key(|holdings| holdings.bytes)?;
        if largest.bytes <= requester.bytes + bytes {
            return None;
        }
        largest
            .tables
            .iter()
            .filter(|key| !requester.tables.contains(*key))
            .filter_map(|key| match self.tables.get(key) {
                Some(TableState::Loaded(table)) => Some((*key, table.last_used)),
                _ => None,
            })
            .min_by_key(|(_, last_used)| *last_used)
            .map(|(key, _)| key)
    }

    /// Removes a table from the maps. Processes whose entries still name it find no rows there
    /// (ids are never reused) and fall back to frame pointers for that mapping.
    fn evict(&mut self, key: TableKey) {
        if let Some(TableState::Loaded(table)) = self.tables.remove(&key) {
            self.maps.remove_table(table.id, table.blocks);
            self.used_bytes -= table.bytes;
            self.stats.evictions.fetch_add(1, Ordering::Relaxed);
            self.publish();
        }
    }

    /// Drops a process's entry and its uses of tables.
    fn forget(&mut self, pid: u32) {
        let Some(known) = self.processes.remove(&pid) else {
            return;
        };
        self.maps.remove_process(pid);
        for key in known.tables {
            if let Some(TableState::Loaded(table)) = self.tables.get_mut(&key) {
                table.users = table.users.saturating_sub(1);
            }
        }
        self.publish();
    }

    /// Forgets processes that exited (or whose pid now runs another process), and files no
    /// process has mapped for a while.
    pub fn forget_exited(&mut self) {
        let gone: Vec<u32> = self
            .processes
            .iter()
            .filter(|(pid, known)| {
                !ProcessKey {
                    pid: **pid,
                    start_time: known.start_time,
                }
                .is_running()
            })
            .map(|(pid, _)| *pid)
            .collect();
        for pid in gone {
            self.forget(pid);
        }
        self.told
            .retain(|&(pid, start_time)| ProcessKey { pid, start_time }.is_running());
        let now = Instant::now();
        self.files
            .retain(|_, layout| now.duration_since(layout.last_used) < FORGET_FILES_AFTER);
        self.tables.retain(|_, state| match state {
            TableState::Failed {
                retry: Some(at), ..
            }
            | TableState::OverShare { retry: at, .. } => now < *at,
            _ => true,
        });
    }

    fn publish(&self) {
        let loaded = self
            .tables
            .values()
            .filter(|state| matches!(state, TableState::Loaded(_)))
            .count();
        self.stats.tables.store(loaded as u64, Ordering::Relaxed);
        self.stats.bytes.store(self.used_bytes, Ordering::Relaxed);
        self.stats
            .processes
            .store(self.processes.len() as u64, Ordering::Relaxed);
    }
}

mod metrics;

#[cfg(test)]
mod tests;
