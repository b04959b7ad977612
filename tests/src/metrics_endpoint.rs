//! The daemon's `/metrics` endpoint as a client sees it: a free port to serve it on, one scrape,
//! and the page parsed. Shared by the tests and by `cargo xtask bench` (which includes it by path).

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};

/// A local address nobody listens on now (bound, read back, released), e.g. for
/// `--metrics-listen`.
pub fn free_local_address() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free local port")?;
    Ok(listener.local_addr()?)
}

/// The body of the `/metrics` page served at `address`.
pub fn scrape(address: SocketAddr) -> Result<String> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))
        .with_context(|| format!("connecting to the daemon's metrics at {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    // HTTP/1.0, so that the server closes after its answer and reading to the end ends. One
    // write: the daemon answers as soon as it reads the request line and then closes, so a
    // request sent in pieces could meet a closed socket.
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .context("sending the metrics request")?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .context("reading the daemon's metrics")?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("malformed HTTP response from the daemon's metrics endpoint")?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("the daemon's metrics endpoint answered {status:?}");
    }
    Ok(body.to_owned())
}

/// `name{label="value"}`: the key of a metric with one label, as [`samples`] gives it.
pub fn labelled(name: &str, label: &str, value: &str) -> String {
    format!("{name}{{{label}=\"{value}\"}}")
}

/// The samples of a Prometheus or OpenMetrics text page as (key, value) pairs, the key being the
/// name with its labels as written (`name` or `name{label="value"}`). Comment lines (`# HELP`,
/// `# TYPE`, `# EOF`) are skipped, and so is anything after the value (a timestamp, an
/// exemplar).
pub fn samples(text: &str) -> impl Iterator<Item = (&str, &str)> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let key_end = match line.find(['{', ' ', '\t'])? {
            brace if line[brace..].starts_with('{') => brace + labels_len(&line[brace..])?,
            space => space,
        };
        let (key, rest) = line.split_at(key_end);
        Some((key, rest.split_whitespace().next()?))
    })
}

/// Length of the label set `{...}` that `text` starts with, up to its closing brace; quoted
/// label values may hold braces and escaped quotes.
fn labels_len(text: &str) -> Option<usize> {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// The page's values by key (see [`samples`]); unparsable values are left out.
pub fn parse(text: &str) -> BTreeMap<String, f64> {
    samples(text)
        .filter_map(|(key, value)| Some((key.to_owned(), value.parse().ok()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prometheus_and_openmetrics_text() {
        let text = "# HELP profiler_records Samples handled.\n\
                    # TYPE profiler_records counter\n\
                    profiler_records_total 42\n\
                    profiler_jvms{state=\"ready\"} 3\n\
                    profiler_queue_bytes 1.5e3\n\
                    profiler_x_total{reason=\"a } b\",kind=\"q\\\"\"} 7 1700000000\n\
                    profiler_created_total 2 # {trace_id=\"t\"} 1.0\n\
                    \n\
                    # EOF\n";
        let metrics = parse(text);
        assert_eq!(metrics.len(), 5, "{metrics:?}");
        assert_eq!(metrics["profiler_records_total"], 42.0);
        assert_eq!(metrics[&labelled("profiler_jvms", "state", "ready")], 3.0);
        assert_eq!(metrics["profiler_queue_bytes"], 1500.0);
        assert_eq!(
            metrics["profiler_x_total{reason=\"a } b\",kind=\"q\\\"\"}"],
            7.0
        );
        assert_eq!(metrics["profiler_created_total"], 2.0);
    }

    #[test]
    fn leaves_out_malformed_lines() {
        let metrics = parse("no_value\nbad{unclosed=\"x\"\nnot_a_number abc\nok 1\n");
        assert_eq!(
            metrics.into_iter().collect::<Vec<_>>(),
            [("ok".to_owned(), 1.0)]
        );
    }
}
