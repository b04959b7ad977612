//! `profiler-daemon subscribe`: a client of the daemon's live stream that writes each profile
//! as a pprof file or prints its top functions.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use crate::export::proto::profiler::v1::profile_stream_client::ProfileStreamClient;
use crate::export::proto::profiler::v1::{ProfileMessage, SubscribeRequest};
use crate::pprof::{decode, proto, string_at};
use crate::profile_model::ProfileKind;

/// What to do with each profile received.
pub enum Sink {
    /// Write `cpu-<time>-<pid>-<service>.pb.gz` (and `offcpu-...`) files here.
    Directory(PathBuf),
    /// Print the N functions with the most self samples.
    Top(usize),
}

pub struct Subscription {
    /// `host:port` or a URL (`http://host:port`).
    pub address: String,
    pub pids: Vec<u32>,
    pub services: Vec<String>,
    pub sink: Sink,
    /// Stop after this many profiles (default: until the daemon stops).
    pub count: Option<u64>,
}

pub async fn run(subscription: Subscription) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let url = if subscription.address.contains("://") {
        subscription.address.clone()
    } else {
        format!("http://{}", subscription.address)
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .with_context(|| format!("{url:?} is not an address"))?
        .connect_timeout(Duration::from_secs(5));
    let mut client = ProfileStreamClient::new(
        endpoint
            .connect()
            .await
            .with_context(|| format!("cannot connect to {url}"))?,
    )
    // Profiles of busy JVMs can exceed gRPC's default 4 MiB message size.
    .max_decoding_message_size(256 << 20);
    let mut stream = client
        .subscribe(SubscribeRequest {
            pids: subscription.pids.clone(),
            service_names: subscription.services.clone(),
        })
        .await
        .context("subscribe")?
        .into_inner();
    if let Sink::Directory(dir) = &subscription.sink {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut received = 0;
    while let Some(message) = stream.message().await.context("receiving a profile")? {
        if message.skipped_before > 0 {
            eprintln!(
                "warning: {} profiles skipped (this client read too slowly)",
                message.skipped_before
            );
        }
        match &subscription.sink {
            Sink::Directory(dir) => {
                let start = UNIX_EPOCH + Duration::from_nanos(message.start_unix_nanos as u64);
                // The profile's type is its `__name__` label, as Pyroscope's.
                let kind = message
                    .labels
                    .iter()
                    .find(|l| l.name == "__name__")
                    .and_then(|l| ProfileKind::from_pyroscope_name(&l.value))
                    .unwrap_or(ProfileKind::Cpu);
                // The stream carries no process name: the service stands in for it.
                let service = &message.service_name;
                let name = format!(
                    "{}.pb.gz",
                    crate::output::file_name::file_stem(kind, start, message.pid, service, service)
                );
                let path = dir.join(name);
                std::fs::write(&path, &message.pprof_gzip)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("{}", path.display());
            }
            Sink::Top(n) => print!("{}", render_top(&message, *n)?),
        }
        received += 1;
        if subscription.count.is_some_and(|count| received >= count) {
            break;
        }
    }
    Ok(())
}

/// A table of the functions with the most self samples in one profile.
fn render_top(message: &ProfileMessage, n: usize) -> anyhow::Result<String> {
    let profile = decode(&message.pprof_gzip)?;
    let rows = self_samples_by_function(&profile);
    let total: i64 = rows.iter().map(|(_, count)| count).sum();
    let start = humantime::format_rfc3339_seconds(
        UNIX_EPOCH + Duration::from_nanos(message.start_unix_nanos as u64),
    );
    let mut out = format!(
        "{start}  pid {}  {}  {total} samples\n",
        message.pid, message.service_name
    );
    for (name, count) in rows.iter().take(n) {
        let share = 100.0 * *count as f64 / total.max(1) as f64;
        out.push_str(&format!("{share:6.2}% {count:>8}  {name}\n"));
    }
    Ok(out)
}

/// (function name, samples where it is the leaf frame), most first.
fn self_samples_by_function(profile: &proto::Profile) -> Vec<(String, i64)> {
    let text = |index: i64| string_at(profile, index).to_owned();
    let functions: HashMap<u64, String> = profile
        .function
        .iter()
        .map(|f| (f.id, text(f.name)))
        .collect();
    let leaves: HashMap<u64, String> = profile
        .location
        .iter()
        .filter_map(|location| {
            // The first line is the innermost (inlined) function.
            let line = location.line.first()?;
            Some((location.id, functions.get(&line.function_id)?.clone()))
        })
        .collect();
    let mut counts: HashMap<String, i64> = HashMap::new();
    for sample in &profile.sample {
        let Some(leaf) = sample.location_id.first() else {
            continue;
        };
        let name = leaves
            .get(leaf)
            .cloned()
            .unwrap_or_else(|| "[unknown]".into());
        *counts.entry(name).or_default() += sample.value.first().copied().unwrap_or(0);
    }
    let mut rows: Vec<(String, i64)> = counts.into_iter().collect();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile_model::testing::cpu_profile;

    #[test]
    fn top_counts_leaf_frames() {
        let profile = crate::pprof::encode(
            &cpu_profile(&[(&["hot", "main"], 7, None), (&["main"], 3, None)]),
            true,
        );
        assert_eq!(
            self_samples_by_function(&profile),
            vec![("hot".to_string(), 7), ("main".to_string(), 3)]
        );
        let message = ProfileMessage {
            pid: 5,
            service_name: "svc".into(),
            pprof_gzip: crate::pprof::encode_gzipped(&profile).expect("encodes"),
            ..Default::default()
        };
        let table = render_top(&message, 1).expect("renders");
        assert!(table.contains("pid 5  svc  10 samples"), "{table}");
        assert!(table.contains(" 70.00%        7  hot"), "{table}");
        assert!(!table.contains("main\n"), "{table}");
    }
}
