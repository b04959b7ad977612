//! An nmethod as the JVMTI sidecar agent recorded it, as plain data: `crate::sidecar::index`
//! parses the agent's records into these, the naming policy reads them.

use std::sync::Arc;

use super::method::MethodInfo;
use super::pc::record_at;

/// One nmethod as the agent described it when the JVM installed it.
#[derive(Debug, Default)]
pub struct RecordedNmethod {
    /// The `Method*` of the compiled method (0 if the agent could not tell).
    pub method_ptr: u64,
    pub code_size: u32,
    /// The compiled method first, then the methods inlined into it.
    pub methods: Vec<Arc<MethodInfo>>,
    /// (pc offset from the code start, chain innermost first as (index in `methods`, bci)),
    /// sorted by offset.
    pub pcs: Vec<(u32, Vec<(u32, i32)>)>,
}

impl RecordedNmethod {
    /// The inline chain at `pc_offset`, innermost first, by the one pc rule
    /// ([`record_at`]).
    pub fn chain(&self, pc_offset: u32, top: bool) -> Vec<(Arc<MethodInfo>, i32)> {
        let Some((_, frames)) = record_at(&self.pcs, i64::from(pc_offset), top, |(offset, _)| {
            i64::from(*offset)
        }) else {
            return Vec::new();
        };
        frames
            .iter()
            .filter_map(|(method, bci)| Some((self.methods.get(*method as usize)?.clone(), *bci)))
            .collect()
    }

    /// The compiled method.
    pub fn root(&self) -> Option<&Arc<MethodInfo>> {
        self.methods.first()
    }
}
