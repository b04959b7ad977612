//! A Java method's names and line table, and the normalisation every name source applies: class
//! names in dotted form without the per-run address of hidden classes, source files qualified
//! with the package directory.

/// A method's names and line table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodInfo {
    /// `java.lang.Thread`
    pub class: String,
    pub name: String,
    /// `(Ljava/lang/Runnable;)V`
    pub signature: String,
    /// `java/lang/Thread.java`
    pub file: Option<String>,
    /// (start bci, line), sorted by bci.
    pub lines: Vec<(u32, u32)>,
    /// `java.lang.Thread.run(Ljava/lang/Runnable;)V`, built once: every interval's profile
    /// names its frames anew, and formatting it each time was most of naming a cached method.
    /// (So the names above are not to be changed after [`MethodInfo::from_internal`].)
    full_name: String,
    /// Where the signature starts in `full_name`.
    function_len: usize,
}

impl MethodInfo {
    /// A method named in the JVM's internal form (`java/lang/Thread`, `Thread.java`), as every
    /// source shows it: see [`stable_class_name`] and [`source_path`]. `lines` need not be
    /// sorted.
    pub fn from_internal(
        internal_class: &str,
        name: String,
        signature: String,
        source_file: Option<&str>,
        mut lines: Vec<(u32, u32)>,
    ) -> Self {
        lines.sort_by_key(|(bci, _)| *bci);
        let class = stable_class_name(internal_class);
        let full_name = format!("{class}.{name}{signature}");
        let function_len = full_name.len() - signature.len();
        Self {
            class,
            name,
            signature,
            full_name,
            function_len,
            file: source_file
                .filter(|file| !file.is_empty())
                .map(|file| source_path(internal_class, file)),
            lines,
        }
    }

    /// `java.lang.Thread.run`: the name frames show.
    pub fn function_name(&self) -> &str {
        self.full_name
            .get(..self.function_len)
            .unwrap_or(&self.full_name)
    }

    /// `java.lang.Thread.run(Ljava/lang/Runnable;)V`: the name with the signature.
    pub fn name_with_signature(&self) -> &str {
        &self.full_name
    }

    /// The line of `bci`: the last table entry at or before it (the first entry's line before
    /// the table starts, 0 without a table).
    pub fn line_of(&self, bci: u32) -> u32 {
        let index = self.lines.partition_point(|(start, _)| *start <= bci);
        match index.checked_sub(1).and_then(|i| self.lines.get(i)) {
            Some((_, line)) => *line,
            None => self.lines.first().map_or(0, |(_, line)| *line),
        }
    }

    /// Whether `other` names the same method (class, name and signature; lines may differ).
    pub fn same_method(&self, other: &MethodInfo) -> bool {
        self.class == other.class && self.name == other.name && self.signature == other.signature
    }
}

/// `Busy$$Lambda$2+0x00007f8e84000c28` -> `Busy$$Lambda$2`: the address differs every run, and
/// `java/lang/Thread` -> `java.lang.Thread`.
pub fn stable_class_name(internal: &str) -> String {
    let name = match internal.find("+0x") {
        Some(at) => &internal[..at],
        None => internal,
    };
    name.replace('/', ".")
}

/// The Java name of a class from its internal name, as allocation profiles show it:
/// `java/lang/String` -> `java.lang.String`, `[I` -> `int[]`, `[[Ljava/lang/Object;` ->
/// `java.lang.Object[][]` (hidden classes' addresses dropped, see [`stable_class_name`]).
pub fn java_type_name(internal: &str) -> String {
    let dimensions = internal.bytes().take_while(|b| *b == b'[').count();
    if dimensions == 0 {
        return stable_class_name(internal);
    }
    let element = &internal[dimensions..];
    let mut name = match element {
        "Z" => "boolean".to_owned(),
        "B" => "byte".to_owned(),
        "C" => "char".to_owned(),
        "S" => "short".to_owned(),
        "I" => "int".to_owned(),
        "J" => "long".to_owned(),
        "F" => "float".to_owned(),
        "D" => "double".to_owned(),
        object => stable_class_name(
            object
                .strip_prefix('L')
                .and_then(|o| o.strip_suffix(';'))
                .unwrap_or(object),
        ),
    };
    for _ in 0..dimensions {
        name.push_str("[]");
    }
    name
}

/// `Thread.java` of `java/lang/Thread` -> `java/lang/Thread.java`: pprof file names are paths.
pub fn source_path(internal_class: &str, source_file: &str) -> String {
    match internal_class.rfind('/') {
        Some(slash) => format!("{}/{source_file}", &internal_class[..slash]),
        None => source_file.to_owned(),
    }
}

/// `Ljava/lang/Thread;` (a class signature, as JVMTI gives it) -> `java/lang/Thread`; anything
/// else unchanged.
pub fn internal_of_signature(signature: &str) -> &str {
    signature
        .strip_prefix('L')
        .and_then(|s| s.strip_suffix(';'))
        .unwrap_or(signature)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocated_types_get_their_java_names() {
        assert_eq!(java_type_name("java/lang/String"), "java.lang.String");
        assert_eq!(java_type_name("[I"), "int[]");
        assert_eq!(java_type_name("[[J"), "long[][]");
        assert_eq!(java_type_name("[Ljava/lang/Object;"), "java.lang.Object[]");
        assert_eq!(
            java_type_name("[[LAllocSplit$Seventy;"),
            "AllocSplit$Seventy[][]"
        );
        assert_eq!(
            java_type_name("Busy$$Lambda+0x00007f8e84000c28"),
            "Busy$$Lambda"
        );
    }

    #[test]
    fn hidden_class_addresses_are_dropped() {
        assert_eq!(
            stable_class_name("Busy$$Lambda$2+0x00007f8e84000c28"),
            "Busy$$Lambda$2"
        );
        assert_eq!(
            stable_class_name("Busy$$Lambda+0x0000000800000c28"),
            "Busy$$Lambda"
        );
        assert_eq!(stable_class_name("java/lang/Thread"), "java.lang.Thread");
    }

    #[test]
    fn lines_come_from_the_last_entry_at_or_before_the_bci() {
        let method = MethodInfo::from_internal(
            "A",
            "m".into(),
            "()V".into(),
            None,
            vec![(14, 12), (0, 10), (7, 11)],
        );
        assert_eq!(method.line_of(0), 10);
        assert_eq!(method.line_of(6), 10);
        assert_eq!(method.line_of(7), 11);
        assert_eq!(method.line_of(100), 12);
        let no_table = MethodInfo::from_internal("A", "m".into(), "()V".into(), None, vec![]);
        assert_eq!(no_table.line_of(3), 0);
    }

    #[test]
    fn both_sources_name_classes_and_files_alike() {
        // Memory gives `com/example/Work`, the agent `Lcom/example/Work;`.
        let memory = MethodInfo::from_internal(
            "com/example/Work",
            "run".into(),
            "()V".into(),
            Some("Work.java"),
            vec![],
        );
        let agent = MethodInfo::from_internal(
            internal_of_signature("Lcom/example/Work;"),
            "run".into(),
            "()V".into(),
            Some("Work.java"),
            vec![],
        );
        assert_eq!(memory, agent);
        assert_eq!(memory.class, "com.example.Work");
        assert_eq!(memory.file.as_deref(), Some("com/example/Work.java"));
        // No package, no file.
        assert_eq!(source_path("Main", "Main.java"), "Main.java");
        let fileless =
            MethodInfo::from_internal("Main", "m".into(), "()V".into(), Some(""), vec![]);
        assert_eq!(fileless.file, None);
    }
}
