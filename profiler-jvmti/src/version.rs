//! Which JVMs the agent reads a `Method*` on.
//!
//! `*(Method**)jmethodID` holds on HotSpot up to JDK 25; JDK 26 changed what a jmethodID is
//! (JDK-8268406), and there the read can fault on a compiler thread, which kills the JVM. So the
//! read is enabled only on the HotSpot feature versions the agent was built and tested for
//! ([`METHOD_PTR_FEATURES`]), read at load time from the VM's own properties; on any other
//! version, or one it cannot read, the agent still records but writes `method_ptr = 0`.

use std::ops::RangeInclusive;

/// HotSpot feature versions on which a jmethodID points to the `Method*` and the agent was
/// tested: 11 to 25. 8 is out of scope, 9 and 10 were never tested, 26 changed the layout.
pub const METHOD_PTR_FEATURES: RangeInclusive<u32> = 11..=25;

/// What the agent concluded about its JVM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JvmVersion {
    /// The feature version from `java.vm.specification.version`, if readable.
    pub feature: Option<u32>,
    /// Whether `Method*` may be read from a jmethodID.
    pub method_ptrs: bool,
    /// What was read, for the status record, e.g. `17 (17.0.16+8-Debian-1deb12u1, OpenJDK
    /// 64-Bit Server VM)`.
    pub description: String,
}

/// The feature version in a Java version string: `17.0.2` -> 17, `25` -> 25, `25+36-LTS` -> 25,
/// `26-ea` -> 26, `1.8` and `1.8.0_392-b08` -> 8 (the old `1.x` scheme). None for anything
/// else.
pub fn feature_version(version: &str) -> Option<u32> {
    fn leading_number(s: &str) -> Option<(u32, &str)> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let number = s[..end].parse().ok()?;
        Some((number, &s[end..]))
    }
    let (mut feature, mut rest) = leading_number(version.trim())?;
    if feature == 1 {
        if let Some(minor) = rest.strip_prefix('.') {
            (feature, rest) = leading_number(minor)?;
        }
    }
    let well_formed = rest.is_empty() || rest.starts_with(['.', '+', '-', '_']);
    (feature > 0 && well_formed).then_some(feature)
}

/// Decides from the VM's properties, any of which may be unreadable: `spec_version`
/// (`java.vm.specification.version`, the feature version on JDK 9 and later), `vm_version`
/// (`java.vm.version`) and `vm_name` (`java.vm.name`).
///
/// `Method*` reads need all three: a HotSpot VM (its name says HotSpot or OpenJDK), a
/// specification version in [`METHOD_PTR_FEATURES`], and a VM version of the same feature (on
/// JDK 8 `java.vm.version` is HotSpot's own `25.x` numbering; disagreement means we do not know
/// the JVM).
pub fn judge(
    spec_version: Option<&str>,
    vm_version: Option<&str>,
    vm_name: Option<&str>,
) -> JvmVersion {
    let feature = spec_version.and_then(feature_version);
    let hotspot = vm_name.is_some_and(|name| name.contains("HotSpot") || name.contains("OpenJDK"));
    let agrees = vm_version.and_then(feature_version) == feature;
    let method_ptrs =
        hotspot && agrees && feature.is_some_and(|f| METHOD_PTR_FEATURES.contains(&f));
    let details: Vec<&str> = [vm_version, vm_name].into_iter().flatten().collect();
    let description = match (spec_version, details.is_empty()) {
        (Some(spec), true) => spec.to_owned(),
        (Some(spec), false) => format!("{spec} ({})", details.join(", ")),
        (None, _) => details.join(", "),
    };
    JvmVersion {
        feature,
        method_ptrs,
        description,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_versions_are_parsed_in_both_numbering_schemes() {
        for (version, feature) in [
            ("11", Some(11)),
            ("17.0.2", Some(17)),
            ("21.0.8+9-LTS", Some(21)),
            ("25", Some(25)),
            ("25+36-LTS", Some(25)),
            ("26", Some(26)),
            ("26-ea+3", Some(26)),
            ("1.8", Some(8)),
            ("1.8.0_392-b08", Some(8)),
            ("9", Some(9)),
            (" 17 ", Some(17)),
            ("", None),
            ("garbage", None),
            ("17abc", None),
            ("1.", None),
            ("0", None),
            ("-17", None),
            ("99999999999999999999", None),
        ] {
            assert_eq!(feature_version(version), feature, "{version:?}");
        }
    }

    const HOTSPOT: Option<&str> = Some("OpenJDK 64-Bit Server VM");

    #[test]
    fn method_ptr_reads_are_enabled_on_tested_hotspot_versions_only() {
        for (spec, vm, enabled) in [
            ("11", "11.0.28+6", true),
            ("17", "17.0.2+8-Debian-1deb12u1", true),
            ("21", "21.0.8+9-LTS", true),
            ("25", "25+36-LTS", true),
            ("26", "26+20", false),
            ("27", "27-ea+1", false),
            ("1.8", "25.392-b08", false),
            ("9", "9.0.4+11", false),
            ("10", "10.0.2+13", false),
            ("garbage", "17.0.2", false),
            // The two properties must tell the same feature version.
            ("17", "26+1", false),
        ] {
            let judged = judge(Some(spec), Some(vm), HOTSPOT);
            assert_eq!(judged.method_ptrs, enabled, "{spec} / {vm}");
            assert_eq!(
                judged.description,
                format!("{spec} ({vm}, OpenJDK 64-Bit Server VM)")
            );
        }
        assert_eq!(
            judge(Some("17.0.2"), Some("17.0.2"), HOTSPOT).feature,
            Some(17)
        );
        let oracle = Some("Java HotSpot(TM) 64-Bit Server VM");
        assert!(judge(Some("21"), Some("21.0.1+12-LTS-29"), oracle).method_ptrs);
    }

    #[test]
    fn anything_unreadable_or_not_hotspot_disables_method_ptr_reads() {
        let unknown = judge(None, None, None);
        assert!(!unknown.method_ptrs);
        assert_eq!(unknown.feature, None);
        assert_eq!(unknown.description, "");
        assert!(!judge(None, Some("17.0.2"), HOTSPOT).method_ptrs);
        assert!(!judge(Some("17"), None, HOTSPOT).method_ptrs);
        assert!(!judge(Some("17"), Some("17.0.2"), None).method_ptrs);
        let openj9 = judge(Some("17"), Some("openj9-0.41.0"), Some("Eclipse OpenJ9 VM"));
        assert!(!openj9.method_ptrs);
        assert_eq!(openj9.feature, Some(17));
        assert_eq!(judge(Some("17"), None, None).description, "17");
    }
}
