//! What no frame of a profile may be called (issue 53's "never a wrong name"): empty or `[]`
//! (a stub named from a freed blob), longer than the daemon's 4 KB bound, with characters no
//! name has (U+FFFD from a lossy decoding, control characters, or the `?` runs the daemon's
//! printable rule makes of them), and a marker without a known reason. Checked over every
//! location of a profile, not only sampled ones.

use crate::proto;

/// The daemon's `symbolize::name_guard::MAX_FRAME_NAME_BYTES`.
pub const MAX_FRAME_NAME_BYTES: usize = 4096;

/// Every reason a Java marker may name (`UnnamedReason`'s labels).
pub const UNNAMED_REASONS: [&str; 9] = [
    "no_jvm",
    "bad_frame_kind",
    "unreadable",
    "missing_field",
    "over_bound",
    "method_reused",
    "code_reused",
    "class_reused",
    "bad_name",
];

/// The reason in a Java marker (`[unknown java method: method_reused]_[j]`), if `name` is one.
pub fn marker_reason(name: &str) -> Option<&str> {
    if !name.starts_with("[unknown java") && !name.starts_with("[unknown compiled") {
        return None;
    }
    let at = name.find(": ")? + 2;
    name.get(at..at + name[at..].find(']')?)
}

/// Each function name of `profile` that breaks the rules above, with what is wrong (names cut
/// to 120 characters).
pub fn bad_frame_names(profile: &proto::Profile) -> Vec<String> {
    let mut bad = Vec::new();
    for location in &profile.location {
        for line in &location.line {
            let name = profile
                .function
                .iter()
                .find(|f| f.id == line.function_id)
                .map_or("", |f| profile.string_table[f.name as usize].as_str());
            let shown: String = name.chars().take(120).collect();
            let stem = name.split("_[").next().unwrap_or(name);
            let problem = if stem.is_empty() || stem == "[]" {
                Some("empty".to_owned())
            } else if name.len() > MAX_FRAME_NAME_BYTES {
                Some(format!("{} bytes", name.len()))
            } else if name.contains('\u{fffd}') || name.chars().any(char::is_control) {
                Some("replacement or control characters".to_owned())
            } else if name.contains("??") {
                Some("unprintable bytes shown as ?".to_owned())
            } else if name.starts_with("[refused frame name") {
                Some("refused by the daemon's last check".to_owned())
            } else if name.starts_with("[unknown java") || name.starts_with("[unknown compiled") {
                match marker_reason(name) {
                    Some(reason) if UNNAMED_REASONS.contains(&reason) => None,
                    other => Some(format!("marker without a known reason ({other:?})")),
                }
            } else {
                None
            };
            if let Some(problem) = problem {
                bad.push(format!("{problem}: {shown:?}"));
            }
        }
    }
    bad
}
