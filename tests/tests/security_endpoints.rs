//! Local users against the daemon's endpoints and its attach path (SECURITY.md, "Hazards
//! closed"): each test runs the real daemon, the hostile side as the unprivileged
//! `profiler-test` user, and shows the daemon unharmed (tests/src/hostile.rs).

use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::hostile::{unprivileged_user, Scenario};
use profiler_tests::*;

/// More connections than the daemon's hard limit on open files in the scenario below.
const HOG_CONNECTIONS: u32 = 5000;

/// The soft limit of the daemon's `Max open files` in `/proc/PID/limits`.
fn open_files_limit(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .expect("limits")
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|values| values.split_whitespace().next()?.parse().ok())
        .expect("Max open files")
}

/// Scrapes `address` until it answers, for at most `within`.
fn scrape_within(address: std::net::SocketAddr, within: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + within;
    loop {
        match scrape_metrics(address) {
            Ok(page) => return Ok(page),
            Err(err) if Instant::now() > deadline => return Err(err),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

#[test]
fn idle_connections_to_metrics_cannot_take_the_daemons_descriptors() {
    let user = unprivileged_user();
    let address = free_local_address().expect("a free port");
    let scenario = Scenario::new(Duration::from_secs(10))
        .daemon_args(&["--metrics-listen", &address.to_string()])
        // systemd's default soft limit, and a hard one below what the attacker opens: the
        // daemon raises its soft limit, but only the endpoint's connection limit can save it.
        .open_files(1024, 4096);
    let baseline = scenario.run_baseline();
    let (attacked, (_hog, held, scraped, limit)) = scenario.run(|context| {
        let hog = compile_c("connection_hog.c", context.scratch).expect("gcc");
        // Root grants the descriptors (prlimit), then the user runs the attack.
        let mut hog = Command::new("prlimit")
            .arg(format!("--nofile={0}:{0}", HOG_CONNECTIONS + 100))
            .args(["--", "setpriv"])
            .arg(format!("--reuid={}", user.uid))
            .arg(format!("--regid={}", user.gid))
            .arg("--clear-groups")
            .arg(hog)
            .args(["127.0.0.1", &address.port().to_string()])
            .arg(HOG_CONNECTIONS.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the attacker starts");
        let mut line = String::new();
        std::io::BufReader::new(hog.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the attacker reports");
        let held: u32 = line
            .trim()
            .strip_prefix("holding ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the attacker said {line:?}"));
        // Idle connections are closed after the header timeout (5 s): a scrape gets through.
        let scraped = scrape_within(address, Duration::from_secs(8));
        (
            Workload(hog),
            held,
            scraped,
            open_files_limit(context.daemon_pid),
        )
    });
    println!("the attacker opened {held} connections, the daemon's soft limit was {limit}");
    let page = scraped.expect("/metrics answers during the attack");
    attacked.assert_unharmed(&baseline);
    assert_eq!(
        limit, 4096,
        "the daemon raised its soft limit to the hard one"
    );
    let over_limit = labelled(metric::METRICS_CONNECTIONS_CLOSED, "reason", "over_limit");
    assert!(
        metric_value(&page, &over_limit).is_some_and(|n| n > 0),
        "{over_limit} in:\n{page}"
    );
}
