//! Prints a sidecar records file: `cargo run -p profiler-jvmti-records --example dump_records -- FILE`
//! (e.g. `/proc/PID/root/tmp/.jvm-profiler-NSPID/records`).

use profiler_jvmti_records::channel::{Reader, Update};
use profiler_jvmti_records::record::Record;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args_os()
        .nth(1)
        .ok_or("usage: dump_records FILE")?;
    let mut reader = Reader::new(path.into());
    for update in reader.poll()? {
        match update {
            Update::NewGeneration(header) => println!("{header:?}"),
            Update::Record(Record::CompiledMethodLoad(m)) => {
                let Some(root) = m.root() else { continue };
                println!(
                    "nmethod {:#x}+{} {}{}{} ({} pcs, {} methods)",
                    m.code_addr,
                    m.code_size,
                    root.class_signature,
                    root.name,
                    root.signature,
                    m.pcs.len(),
                    m.methods.len()
                );
                for pc in &m.pcs {
                    let chain: Vec<String> = pc
                        .frames
                        .iter()
                        .map(|f| {
                            let info = &m.methods[f.method as usize];
                            format!(
                                "{}@{}:{}",
                                info.name,
                                f.bci,
                                info.line_of(f.bci).unwrap_or(0)
                            )
                        })
                        .collect();
                    println!("  {:#x} {}", pc.pc, chain.join(" < "));
                }
            }
            Update::Record(other) => println!("{other:?}"),
        }
    }
    Ok(())
}
