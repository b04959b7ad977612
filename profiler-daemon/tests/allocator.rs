//! The daemon's malloc settings (`own_memory::settle_allocator`), in a test process of their
//! own: they are process-wide, and other tests' freed blocks would be reused in their place.

/// Whether glibc served a `size`-byte block with a mapping of its own: the IS_MMAPPED bit of
/// the chunk's size word, just before the block (a layout glibc has kept since 2.0).
fn served_by_own_mapping(size: usize) -> bool {
    let block = std::hint::black_box(vec![1u8; size]);
    // SAFETY: the word before a malloc'd block is its chunk's size field.
    let size_word = unsafe { (block.as_ptr() as *const usize).sub(1).read() };
    size_word & 2 != 0
}

#[test]
fn large_blocks_keep_mappings_of_their_own_after_a_larger_one_is_freed() {
    profiler_daemon::own_memory::settle_allocator();
    // glibc's default would now serve blocks up to 8 MiB from an arena.
    drop(std::hint::black_box(vec![1u8; 8 << 20]));
    assert!(
        served_by_own_mapping(1 << 20),
        "a 1 MiB block was carved from an arena"
    );
}
