//! One row of the report's table and its verdict against a target: what every measurement
//! section produces, and what the report lays out. A leaf: the sections and the report depend
//! on it, it on neither.

use std::fmt::Write as _;

/// One line of the table.
pub(super) struct Row {
    pub(super) section: &'static str,
    pub(super) measurement: String,
    pub(super) setting: String,
    pub(super) result: String,
    pub(super) target: String,
}

/// The BPF program's per-sample target for a 200-frame Java stack (us): section 2 measures it,
/// the report states it.
pub(super) const MAX_BPF_US_200_FRAMES: f64 = 6.0;

pub(super) fn verdict(met: bool, target: &str) -> String {
    if met {
        format!("{target}: met")
    } else {
        format!("{target}: **missed**")
    }
}

/// The table, then the missed targets.
pub(super) fn write_rows(out: &mut String, rows: &[Row], notes: &[String]) {
    let _ = writeln!(out, "| # | measurement | setting | result | target |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            row.section, row.measurement, row.setting, row.result, row.target
        );
    }
    if !notes.is_empty() {
        let _ = writeln!(out, "\n## Missed targets\n");
        for note in notes {
            let _ = writeln!(out, "- {note}");
        }
    }
}
