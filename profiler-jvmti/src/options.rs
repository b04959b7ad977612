//! The agent's options: the string after `=` in `-agentpath:/path/libprofiler_jvmti.so=OPTIONS`,
//! or given to a dynamic attach. Comma-separated, all optional:
//!
//! - `dir=PATH`: the records directory (default `/tmp/.jvm-profiler-<pid>`);
//! - `max_bytes=N`: the size cap of one generation of the records file (default 32 MiB);
//! - `alloc_interval=N`: turn on HotSpot's allocation sampler (JDK 11+), about one sampled object
//!   per N bytes a thread allocates (1 to 2^31 - 1), for the daemon's allocation profiles
//!   (docs/allocation-profiling.md); given again to an agent already loaded, it turns it on there;
//! - `assume_unknown_version`: treat the JVM as a version the agent does not know, whatever it
//!   says (for tests of that path): no `Method*` is read, every `method_ptr` is 0.
//!
//! Anything else is refused before the agent does anything.

use std::path::PathBuf;

use profiler_jvmti_records::channel;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// None: [`channel::records_dir`] of the JVM's pid.
    pub dir: Option<PathBuf>,
    pub max_bytes: u64,
    pub assume_unknown_version: bool,
    /// Bytes between sampled allocations, if the sampler is wanted.
    pub alloc_interval: Option<i32>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            dir: None,
            max_bytes: channel::DEFAULT_MAX_BYTES,
            assume_unknown_version: false,
            alloc_interval: None,
        }
    }
}

impl Options {
    pub fn parse(options: &str) -> Result<Self, String> {
        let mut parsed = Self::default();
        for option in options.split(',').filter(|o| !o.is_empty()) {
            match option.split_once('=') {
                Some(("dir", value)) if !value.is_empty() => {
                    parsed.dir = Some(PathBuf::from(value))
                }
                Some(("max_bytes", value)) => {
                    parsed.max_bytes = value
                        .parse()
                        .map_err(|_| format!("bad max_bytes {value:?}"))?
                }
                Some(("alloc_interval", value)) => {
                    parsed.alloc_interval = Some(
                        value
                            .parse()
                            .ok()
                            .filter(|bytes: &i32| *bytes > 0)
                            .ok_or_else(|| format!("bad alloc_interval {value:?}"))?,
                    )
                }
                None if option == "assume_unknown_version" => parsed.assume_unknown_version = true,
                _ => return Err(format!("unknown option {option:?}")),
            }
        }
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_with_defaults_and_the_unknown_version_flag() {
        assert_eq!(Options::parse(""), Ok(Options::default()));
        assert_eq!(
            Options::parse("dir=/tmp/x,max_bytes=4096"),
            Ok(Options {
                dir: Some(PathBuf::from("/tmp/x")),
                max_bytes: 4096,
                assume_unknown_version: false,
                alloc_interval: None,
            })
        );
        assert_eq!(
            Options::parse("alloc_interval=524288").map(|o| o.alloc_interval),
            Ok(Some(524288))
        );
        let flagged = Options::parse("max_bytes=262144,assume_unknown_version,").expect("parses");
        assert!(flagged.assume_unknown_version);
        assert_eq!(flagged.max_bytes, 262144);
        assert_eq!(flagged.dir, None);
        assert!(
            Options::parse("assume_unknown_version")
                .expect("parses")
                .assume_unknown_version
        );
        for bad in [
            "max_bytes=lots",
            "max_bytes=-1",
            "verbose",
            "assume_unknown_version=yes",
            "dir=",
            "dir",
            "alloc_interval=0",
            "alloc_interval=-5",
            "alloc_interval=4294967296",
            "alloc_interval",
        ] {
            assert!(Options::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
