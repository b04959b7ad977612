//! The pc-to-scope rule, one for every name source: which debug record (a HotSpot `PcDesc`, or
//! one of the agent's pc records) describes a pc of compiled code.
//!
//! A return address (every frame but the top one) points after its call, whose record is at
//! exactly that offset. The top frame's pc was interrupted anywhere inside the region a record
//! ends: the record is the first one past it (as AsyncGetCallTrace's `pc_desc_near(pc + 1)`).
//! A pc past the last record has none.

/// The record describing `pc_offset` among `records`, sorted by their offsets (`offset_of`).
/// `top` is true for the interrupted frame, false for a return address.
pub fn record_at<T>(
    records: &[T],
    pc_offset: i64,
    top: bool,
    offset_of: impl Fn(&T) -> i64,
) -> Option<&T> {
    let index = if top {
        records.partition_point(|record| offset_of(record) <= pc_offset)
    } else {
        records.partition_point(|record| offset_of(record) < pc_offset)
    };
    records.get(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(records: &[(i64, &'static str)], pc: i64, top: bool) -> Option<&'static str> {
        record_at(records, pc, top, |(offset, _)| *offset).map(|(_, what)| *what)
    }

    #[test]
    fn return_addresses_match_exactly_and_interrupted_pcs_take_the_next_record() {
        let records = [(-1, "entry"), (10, "call"), (20, "loop")];
        // A return address at a record's offset is that record.
        assert_eq!(at(&records, 10, false), Some("call"));
        assert_eq!(at(&records, 20, false), Some("loop"));
        // An interrupted pc at a record's offset is past that record's region: the next one.
        assert_eq!(at(&records, 10, true), Some("loop"));
        // Between records, both take the next one.
        assert_eq!(at(&records, 15, true), Some("loop"));
        assert_eq!(at(&records, 15, false), Some("loop"));
        assert_eq!(at(&records, 0, true), Some("call"));
        // Before the first real record (the -1 sentinel HotSpot writes).
        assert_eq!(at(&records, -1, false), Some("entry"));
        assert_eq!(at(&records, -1, true), Some("call"));
        // At or past the last record: nothing is known.
        assert_eq!(at(&records, 20, true), None);
        assert_eq!(at(&records, 21, false), None);
        assert_eq!(at(&[], 0, true), None);
    }
}
