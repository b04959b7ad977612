//! The tests crate's opt-out (`PROFILER_TESTS_SKIP`, CONTRIBUTING.md), for this crate's unit
//! tests, which cannot depend on that crate: a test that cannot run here fails unless the item
//! it needs is listed.

/// Fails with `why` and how to opt out, unless `PROFILER_TESTS_SKIP` lists `item`; then says
/// the test is skipped (the caller returns).
#[track_caller]
pub(crate) fn unless_skipped(item: &str, why: &str) {
    let listed = std::env::var("PROFILER_TESTS_SKIP")
        .is_ok_and(|list| list.split(',').any(|listed| listed.trim() == item));
    assert!(
        listed,
        "{why}: set PROFILER_TESTS_SKIP={item} to skip this test instead of failing"
    );
    eprintln!("SKIPPED (PROFILER_TESTS_SKIP lists {item}): {why}");
}
