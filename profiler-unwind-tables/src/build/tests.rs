use std::path::PathBuf;

use gimli::{EhFrameHdr, UnwindSection as _};
use object::{Object as _, ObjectSection as _};
use profiler_common::cfi::find_cfi_row;

use super::*;

/// System files with large, compiler-written tables: the C library, an interpreter and a JVM.
fn system_files() -> Vec<PathBuf> {
    let mut files = vec![
        PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
        std::fs::canonicalize("/usr/bin/python3").expect("python3 (Debian's) is installed"),
    ];
    let jvm = std::fs::read_dir("/usr/lib/jvm")
        .expect("a Debian JDK is installed (the tests' setup installs one)")
        .filter_map(|entry| Some(entry.ok()?.path().join("lib/server/libjvm.so")))
        .find(|path| path.exists())
        .expect("a Debian JDK's libjvm.so");
    files.push(jvm);
    files
}

/// The rule gimli evaluates directly for `address` (through `.eh_frame_hdr`'s search table),
/// in the table's terms; `None` where no FDE covers it.
fn direct_rule(data: &[u8], address: u64) -> Option<CfiRow> {
    let file = object::File::parse(data).expect("ELF");
    let eh_frame = file.section_by_name(".eh_frame").expect(".eh_frame");
    let hdr = file
        .section_by_name(".eh_frame_hdr")
        .expect(".eh_frame_hdr");
    let bases = BaseAddresses::default()
        .set_eh_frame(eh_frame.address())
        .set_eh_frame_hdr(hdr.address())
        .set_text(file.section_by_name(".text").expect(".text").address());
    let section = EhFrame::new(eh_frame.data().expect("data"), gimli::LittleEndian);
    let header = EhFrameHdr::new(hdr.data().expect("data"), gimli::LittleEndian)
        .parse(&bases, 8)
        .expect("header");
    let table = header.table().expect("search table");
    let fde = table
        .fde_for_address(&section, &bases, address, EhFrame::cie_from_offset)
        .ok()?;
    let mut context = Box::new(UnwindContext::new());
    let row = fde
        .unwind_info_for_address(&section, &bases, &mut context, address)
        .ok()?;
    Some(compact_rule(row, &section))
}

#[test]
fn table_lookups_match_direct_evaluation_of_system_libraries() {
    for path in system_files() {
        let data = std::fs::read(&path).expect("readable");
        let table = build_table(&data[..], BuildLimits::default()).expect("table builds");
        assert_eq!(table.source, CfiSource::EhFrame, "{}", path.display());
        let rows = &table.rows;
        assert!(rows.len() > 1000, "{}: {} rows", path.display(), rows.len());
        assert!(
            rows.windows(2)
                .all(|w| w[0].pc < w[1].pc && !w[0].same_rule(&w[1])),
            "{}: rows sorted, strictly increasing and merged",
            path.display()
        );
        let (first, last) = (rows[0].pc as u64, rows[rows.len() - 1].pc as u64);
        // Random addresses over the covered range (a fixed LCG: reproducible).
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut compared = 0;
        for _ in 0..3000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let address = first + (state >> 11) % (last - first);
            let found = find_cfi_row(rows.len() as u32, address as u32, |i| {
                rows.get(i as usize).copied()
            })
            .expect("inside the table");
            let expected = direct_rule(&data, address).unwrap_or(CfiRow::new(
                0,
                CfaKind::None,
                0,
                RBP_UNCHANGED,
            ));
            assert!(
                found.same_rule(&expected),
                "{} at {address:#x}: table {found:?}, direct {expected:?}",
                path.display()
            );
            compared += 1;
        }
        // Compilers' rules fit the table: rsp- or rbp-based rows, gaps between functions
        // (padding), almost nothing the walker cannot follow.
        let mut kinds = std::collections::BTreeMap::new();
        for row in rows {
            *kinds.entry(row.kind()).or_insert(0usize) += 1;
        }
        let count = |kind| kinds.get(&Some(kind)).copied().unwrap_or(0);
        let plain = count(CfaKind::Rsp) + count(CfaKind::Rbp);
        assert!(plain * 10 > rows.len() * 7, "{}: {kinds:?}", path.display());
        assert!(
            count(CfaKind::Unsupported) * 100 < rows.len(),
            "{}: {kinds:?}",
            path.display()
        );
        eprintln!(
            "{}: {} rows {kinds:?}, {} skipped FDEs, {compared} lookups matched",
            path.display(),
            rows.len(),
            table.skipped_fdes
        );
    }
}

#[test]
fn plt_entries_get_their_expression_rule() {
    // libc's PLT: the entries' CFA is an expression of rsp and the pc.
    let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
    let file = object::File::parse(&*data).expect("ELF");
    let plt = file.section_by_name(".plt").expect(".plt");
    let table = build_table(&data[..], BuildLimits::default()).expect("table");
    let row = find_cfi_row(table.rows.len() as u32, plt.address() as u32 + 0x20, |i| {
        table.rows.get(i as usize).copied()
    })
    .expect("a row");
    assert_eq!(row.kind(), Some(CfaKind::Plt), "{row:?}");
    assert_eq!(row.cfa_offset, 11);
}

/// lld writes no FDE for `.plt` (rustc's libLLVM and librustc_driver, on every machine that
/// builds this project): the table gives the stubs their ABI rule rather than no rule.
#[test]
fn plt_sections_without_fdes_get_their_abi_rule() {
    let sysroot = std::process::Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc");
    let lib = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim()).join("lib");
    let library = std::fs::read_dir(&lib)
        .expect("the sysroot's lib")
        .filter_map(|entry| Some(entry.ok()?.path()))
        .find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("libLLVM") && name.contains(".so"))
        })
        .expect("rustc's libLLVM");
    let data = std::fs::read(&library).expect("libLLVM");
    let file = object::File::parse(&*data).expect("ELF");
    let plt = file.section_by_name(".plt").expect(".plt").address() as u32;
    let table = build_table(&data[..], BuildLimits::default()).expect("table");
    let row_at = |pc: u32| {
        find_cfi_row(table.rows.len() as u32, pc, |i| {
            table.rows.get(i as usize).copied()
        })
        .expect("a row")
    };
    // The second entry, at its `jmp *GOT` and after its `push`.
    for pc in [plt + 0x10, plt + 0x10 + 11] {
        let row = row_at(pc);
        assert_eq!(row.kind(), Some(CfaKind::Plt), "{row:?} at {pc:#x}");
        assert_eq!(row.cfa_offset, 11);
    }
}

#[test]
fn plt_expressions_are_recognised_exactly() {
    let mut expression = PLT_EXPRESSION_HEAD.to_vec();
    expression.push(DW_OP_LIT0 + 11);
    expression.extend(PLT_EXPRESSION_TAIL);
    assert_eq!(plt_threshold(&expression), Some(11));
    expression[7] = 0x2b; // gt, not ge
    assert_eq!(plt_threshold(&expression), None);
    assert_eq!(plt_threshold(&PLT_EXPRESSION_HEAD), None);
    assert_eq!(plt_threshold(&[]), None);
}

/// FDEs as `(start, end, rows)`, collected in this order.
fn collected(fdes: &[(u32, u32, &[CfiRow])]) -> (Vec<CfiRow>, Vec<FdeRows>) {
    let mut rows = Vec::new();
    let mut index = Vec::new();
    for (start, end, fde_rows) in fdes {
        index.push(FdeRows {
            start: *start,
            end: *end,
            first: rows.len() as u32,
            len: fde_rows.len() as u32,
        });
        rows.extend_from_slice(fde_rows);
    }
    (rows, index)
}

#[test]
fn gaps_between_functions_have_no_rule_and_equal_rules_merge() {
    let rsp8 = |pc| CfiRow::new(pc, CfaKind::Rsp, 8, RBP_UNCHANGED);
    let rsp16 = |pc| CfiRow::new(pc, CfaKind::Rsp, 16, -2);
    let none = |pc| CfiRow::new(pc, CfaKind::None, 0, RBP_UNCHANGED);
    // Out of address order, as a linker may lay them out.
    let (rows, fdes) = collected(&[
        (0x2000, 0x2010, &[rsp8(0x2000)]),
        (0x1000, 0x1020, &[rsp8(0x1000), rsp16(0x1004)]),
        // The next function starts where this one ends with the same rule: merged.
        (0x1020, 0x1030, &[rsp16(0x1020)]),
    ]);
    assert_eq!(
        merge(&rows, fdes),
        [
            rsp8(0x1000),
            rsp16(0x1004),
            none(0x1030),
            rsp8(0x2000),
            none(0x2010)
        ]
    );
}

#[test]
fn overlapping_fdes_keep_the_table_sorted() {
    let rsp = |pc, offset| CfiRow::new(pc, CfaKind::Rsp, offset, RBP_UNCHANGED);
    let none = |pc| CfiRow::new(pc, CfaKind::None, 0, RBP_UNCHANGED);
    let (rows, fdes) = collected(&[
        (0x1000, 0x1100, &[rsp(0x1000, 8), rsp(0x1080, 16)]),
        // Starts inside the first: its rows before 0x1080 are dropped.
        (0x1040, 0x1200, &[rsp(0x1040, 24), rsp(0x10c0, 32)]),
        // Inside the first, behind the rows kept: dropped whole.
        (0x1000, 0x1010, &[rsp(0x1000, 40)]),
    ]);
    let table = merge(&rows, fdes);
    assert!(table.windows(2).all(|pair| pair[0].pc < pair[1].pc));
    assert_eq!(
        table,
        [
            rsp(0x1000, 8),
            rsp(0x1080, 16),
            rsp(0x10c0, 32),
            none(0x1200)
        ]
    );
}

#[test]
fn hostile_files_are_refused_or_bounded_never_a_panic() {
    assert!(matches!(
        build_table(&b"not an ELF file"[..], BuildLimits::default()),
        Err(BuildError::Elf(_))
    ));
    let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
    assert!(matches!(
        build_table(&data[..], BuildLimits { max_rows: 100 }),
        Err(BuildError::TooLarge { max_rows: 100 })
    ));
    // Corrupted call frame information: every byte of .eh_frame flipped in turn (a sample).
    let file = object::File::parse(&*data).expect("ELF");
    let (offset, size) = file
        .section_by_name(".eh_frame")
        .and_then(|s| s.file_range())
        .expect(".eh_frame in the file");
    let mut corrupted = data.clone();
    for i in (0..size as usize).step_by(997) {
        corrupted[offset as usize + i] ^= 0xa5;
        let _ = build_table(&corrupted[..], BuildLimits::default());
    }
}

/// A function with a stack frame over 64 KiB (rustc's compiler closure takes 527 KiB): the rows
/// of its call sites count the CFA's offset in 16 bytes, where a 16-bit offset in bytes would
/// leave them to frame pointers.
#[test]
fn frames_over_64_kib_are_counted_in_16_bytes() {
    let dir = std::env::temp_dir().join(format!("big-frame-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let source = dir.join("big.c");
    std::fs::write(
        &source,
        "__attribute__((noinline)) void fill(char *b) { __asm__ volatile(\"\" :: \"r\"(b) : \"memory\"); }\n\
         void big(void) { char buffer[600000]; fill(buffer); fill(buffer + 1); }\n",
    )
    .expect("source written");
    let library = dir.join("big.so");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-fomit-frame-pointer", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .expect("run cc (a C compiler is needed by the tests; `cargo xtask test` installs it)");
    assert!(status.success(), "cc failed");
    let data = std::fs::read(&library).expect("the library");
    let _ = std::fs::remove_dir_all(&dir);
    let table = build_table(&data[..], BuildLimits::default()).expect("table builds");
    let big: Vec<&CfiRow> = table
        .rows
        .iter()
        .filter(|row| row.kind() == Some(CfaKind::Rsp16))
        .collect();
    assert!(
        big.iter()
            .any(|row| u64::from(row.cfa_offset) * 16 > 600_000),
        "no row of `big`'s frame in 16-byte units: {:?}",
        table.rows
    );
}
