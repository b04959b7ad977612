//! The gRPC peers in Python (grpcio), sharing no code with the daemon: the Pyroscope stand-in
//! (`tests/receiver/pyroscope_receiver.py`, stubs generated from our .proto files) and the OTLP
//! profiles receiver (`tests/receiver/otlp_receiver.py`, PyPI's official opentelemetry-proto
//! stubs), and what they recorded.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context as _, Result};

/// A running receiver, killed when dropped.
pub struct Receiver {
    child: Child,
    pub port: u16,
    pub record_dir: PathBuf,
}

/// One Push request as the receiver saw it.
#[derive(Debug)]
pub struct PushRecord {
    pub headers: serde_json::Map<String, serde_json::Value>,
    pub series: Vec<SeriesRecord>,
}

#[derive(Debug)]
pub struct SeriesRecord {
    pub labels: Vec<(String, String)>,
    /// The raw profiles as received, in order.
    pub profiles: Vec<PathBuf>,
}

impl SeriesRecord {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
}

impl Receiver {
    /// Starts a Pyroscope stand-in on `port` (0: any free port) recording into `record_dir`;
    /// `extra` arguments go to the script (e.g. `--fail-with UNAUTHENTICATED`).
    pub fn start(port: u16, record_dir: &Path, extra: &[&str]) -> Result<Self> {
        let proto_root = workspace_root().join("profiler-daemon/proto");
        let proto_args = ["--proto-root", proto_root.to_str().context("UTF-8 path")?];
        Self::spawn(
            "pyroscope_receiver.py",
            port,
            record_dir,
            &[&proto_args, extra].concat(),
        )
    }

    /// Starts an OTLP profiles receiver on `port` (0: any free port) recording into
    /// `record_dir` (see `recorded_exports`).
    pub fn start_otlp(port: u16, record_dir: &Path, extra: &[&str]) -> Result<Self> {
        Self::spawn("otlp_receiver.py", port, record_dir, extra)
    }

    fn spawn(script: &str, port: u16, record_dir: &Path, extra: &[&str]) -> Result<Self> {
        let root = workspace_root();
        let mut child = Command::new("python3")
            .arg(root.join("tests/receiver").join(script))
            .arg("--record-dir")
            .arg(record_dir)
            .args(["--port", &port.to_string()])
            .args(extra)
            // grpcio, grpcio-tools and opentelemetry-proto, installed there by
            // `cargo xtask test`.
            .env("PYTHONPATH", root.join(".tools/python"))
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the Python gRPC receiver")?;
        let stdout = child.stdout.take().context("receiver stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(port) = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|p| p.parse().ok())
        else {
            let _ = child.kill();
            bail!("receiver did not start: {line:?}");
        };
        Ok(Self {
            child,
            port,
            record_dir: record_dir.to_owned(),
        })
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops the receiver abruptly, as a crashed server would.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The requests recorded in `record_dir`, in arrival order.
pub fn recorded_pushes(record_dir: &Path) -> Result<Vec<PushRecord>> {
    let path = record_dir.join("requests.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    let mut pushes = Vec::new();
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line)?;
        let headers = value["headers"].as_object().cloned().unwrap_or_default();
        let mut series = Vec::new();
        for one in value["series"].as_array().context("series")? {
            let labels = one["labels"]
                .as_object()
                .context("labels")?
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                .collect();
            let profiles = one["profiles"]
                .as_array()
                .context("profiles")?
                .iter()
                .map(|name| record_dir.join(name.as_str().unwrap_or_default()))
                .collect();
            series.push(SeriesRecord { labels, profiles });
        }
        pushes.push(PushRecord { headers, series });
    }
    Ok(pushes)
}

/// The OTLP receiver's records of `record_dir`, one JSON object per request in arrival order
/// (see `tests/receiver/otlp_receiver.py` for their fields).
pub fn recorded_exports(record_dir: &Path) -> Result<Vec<serde_json::Value>> {
    let path = record_dir.join("requests.jsonl");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    };
    text.lines()
        .map(|line| serde_json::from_str(line).context("a request record"))
        .collect()
}

/// Compares the daemon's OTLP .proto files with PyPI's official generated code
/// (`tests/receiver/otlp_proto_check.py`): its report, and whether they match.
pub fn check_otlp_protos() -> Result<(String, bool)> {
    let root = workspace_root();
    let output = Command::new("python3")
        .arg(root.join("tests/receiver/otlp_proto_check.py"))
        .arg("--proto-root")
        .arg(root.join("profiler-daemon/proto"))
        .env("PYTHONPATH", root.join(".tools/python"))
        .output()
        .context("running otlp_proto_check.py")?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok((report, output.status.success()))
}
