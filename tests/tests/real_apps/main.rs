//! Java stacks on real applications from Debian packages, measured against the JDK's own Flight
//! Recorder: the H2 database running a SQL script (`libh2-java`), a Clojure program (`clojure`),
//! an embedded Jetty 9.4 server under HTTP load from `ab` (`libjetty9-java`, `apache2-utils`),
//! and a Spring Web MVC 4.3 service on an embedded Tomcat 9 under the same load
//! (`libspring-web-servlet-java`, `libtomcat9-java`, `libjackson2-databind-java`): deep framework
//! stacks of mostly distinct methods. Each runs on JDK 17 or the JDK of the day, the two taking
//! turns ([`real_app_jdks`]; `PROFILER_REAL_APP_JDKS=11,17,21,25` runs each on those), with `jdk.ExecutionSample` recorded (`settings=profile`, `DebugNonSafepoints`, stack depth
//! 2048) while the daemon profiles the same JVM over the same window.
//!
//! Every run prints, per application and JDK:
//! (a) the share of the JVM's samples with an unknown or truncated Java frame;
//! (b) of samples with Java frames, the share whose outermost Java frame is a thread entry
//!     (`Thread.run`, `Thread.runWith`, a `main` method, or a root JFR saw);
//! (c) the leaf-most compiled or interpreted method (inlined frames folded into the method they
//!     are compiled into) of our samples taken in Java code, against JFR's, with the largest
//!     differences in percentage points and their binomial standard error;
//! (d) what the lost stacks are: counts per kind and the top lost-stack signatures (innermost
//!     frames, the last two frames the walk reached, its end; `[unknown]` frames say where
//!     their address is: a code heap, a mapping of the JVM, unmapped, near 0), and the daemon's
//!     `profiler_unwind_ends_total{reason}` over the window;
//! (e) allocations: the daemon's allocation profiles (`--alloc`, default interval) against the
//!     same recording's `jdk.ObjectAllocationInNewTLAB` and `jdk.ObjectAllocationOutsideTLAB`
//!     (enabled with stack traces by a second settings file, [`EXTRA_EVENTS_JFC`]: the same
//!     HotSpot events, `AllocTracer::send_allocation_*`, which JFR records every one of): events
//!     and bytes per kind over the same window (the whole intervals JFR recorded; JFR's bytes
//!     exact, ours an estimate: their ratio), and the byte share of the top allocation sites, a
//!     site being the allocated class and the innermost Java method under it (stub frames
//!     skipped), with the standard error of our share computed from JFR's events; and the share
//!     of our CPU samples in the hooks' uprobe traps;
//! (f) lock waits: the daemon's `mutex` and `block` profiles (`--lock=1ms`) against the same
//!     recording's `jdk.JavaMonitorEnter` and `jdk.ThreadPark` events (from 1 ms too): waits
//!     and wait time per kind, and each site's share of the waits (see `lock.rs`).
//!
//! JFR is the reference, not the truth: its own biases show in (c). JDK 11's JFR marks no frame
//! inlined (there both sides compare innermost frames, unfolded); JDK 17's drops samples it
//! cannot walk (seen: trivial C1 getters such as H2's `ValueInteger.getValueType`, 0% in JFR,
//! 6 to 10% in ours and in JDK 25's JFR); JDK 25's puts samples taken in stubs on the nearest
//! caller it can walk (seen: SHA-256's stub under `MessageDigest.update` counted in the
//! servlet's `doGet`).
//!
//! Asserted: the harness (the application ran, both profilers saw at least 500 samples of it,
//! JFR's recording was read whole, allocation events included, and both saw allocations in the
//! window) and the targets: at most 1% lost, at least 99% rooted, top leaf methods within 3
//! standard errors plus 10 pp of JFR's; allocation sites (the top 5 of either side, each at
//! least 2% of its bytes) within 3 standard errors plus 3 pp of JFR's, and our total bytes
//! within 3 standard errors plus 2% of JFR's (see [`Measurement::alloc_target_failures`]); where
//! both sides have lock waits enough, each kind's wait time within 15% of JFR's and its top
//! sites' shares of the waits within 3 standard errors plus 5 pp.
//! `PROFILER_REAL_APP_TARGETS=0` reports missed targets without failing (to survey an
//! application or JDK not yet met). `PROFILER_TESTS_SKIP=real-apps` skips these tests where the
//! Debian packages are missing (`cargo xtask test` installs them). `PROFILER_REAL_APP_KEEP=DIR`
//! keeps the recordings, profiles and logs under DIR.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::*;

mod jfr;
mod lock;

use jfr::*;
use lock::*;

/// JFR's recording starts this long after the JVM (its `delay`), once start-up and JIT warm-up
/// are over; `WINDOW` later the daemon is stopped, then the JVM, whose exit ends the recording.
/// The daemon profiles from the JVM's start, in `INTERVAL`-second profiles; only those inside
/// JFR's recording count, and only JFR's samples inside them.
const WARM_UP_SECS: u64 = 8;
/// 20 s gives 1,600 to 3,400 of our samples per application at 99 Hz (28 s gave 2,400 to 4,400,
/// with the same verdicts): enough for the shares asserted, and CI time for more JDKs.
const WINDOW_SECS: u64 = 20;
const INTERVAL_SECS: u64 = 5;
const FREQUENCY_HZ: u32 = 99;
/// Below this many samples of the JVM from our profiles, the harness failed.
const MIN_SAMPLES: i64 = 500;
/// Below this many of JFR's samples, the harness failed. JFR samples only threads in Java code,
/// at most a few per period, and fewer on some machines than on others for the same load:
/// Spring on JDK 17 gave 781 on one machine of this kind and 427 to 461 on another, with this
/// daemon and the one before it alike (the shares' allowances follow the counts).
const MIN_JFR_SAMPLES: i64 = 300;

/// JFR settings added to `profile` (a second `settings=` file, which JDK 11 to 27 all merge):
/// the TLAB allocation events, off in JFR's `profile` settings since JDK 16 (its throttled
/// `jdk.ObjectAllocationSample` replaced them; JDK 11's has them on), with stack traces; neither
/// has a threshold or a throttle: JFR records every event. And the lock events' threshold at
/// [`LOCK_THRESHOLD`] (`profile` has them on, with stack traces, from 10 ms).
const EXTRA_EVENTS_JFC: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<configuration version="2.0" label="TLAB allocation events, lock events from 1 ms">
  <event name="jdk.ObjectAllocationInNewTLAB">
    <setting name="enabled">true</setting>
    <setting name="stackTrace">true</setting>
  </event>
  <event name="jdk.ObjectAllocationOutsideTLAB">
    <setting name="enabled">true</setting>
    <setting name="stackTrace">true</setting>
  </event>
  <event name="jdk.JavaMonitorEnter">
    <setting name="enabled">true</setting>
    <setting name="stackTrace">true</setting>
    <setting name="threshold">1 ms</setting>
  </event>
  <event name="jdk.ThreadPark">
    <setting name="enabled">true</setting>
    <setting name="stackTrace">true</setting>
    <setting name="threshold">1 ms</setting>
  </event>
</configuration>
"#;
/// The daemon's lock threshold, as JFR's in [`EXTRA_EVENTS_JFC`]: below the default 10 ms, so
/// that the applications' short monitor waits (Jetty's report rendering, milliseconds) count.
const LOCK_THRESHOLD: &str = "--lock=1ms";
/// The daemon's `--alloc` sampling interval when a profile does not say (its default).
const DEFAULT_ALLOC_INTERVAL: i64 = 512 * 1024;
/// The allocation sites asserted: the top `ASSERTED_SITES` of each side by bytes, each at least
/// `MIN_SITE_SHARE` of that side's bytes.
const ASSERTED_SITES: usize = 5;
const MIN_SITE_SHARE: f64 = 0.02;

const H2_JAR: &str = "/usr/share/java/h2.jar";
const CLOJURE_JAR: &str = "/usr/share/java/clojure.jar";
const JETTY_JARS: &[&str] = &[
    "/usr/share/java/jetty9-server.jar",
    "/usr/share/java/jetty9-servlet.jar",
    "/usr/share/java/jetty9-http.jar",
    "/usr/share/java/jetty9-io.jar",
    "/usr/share/java/jetty9-util.jar",
    "/usr/share/java/jetty9-security.jar",
    "/usr/share/java/servlet-api.jar",
];

/// Spring Web MVC 4.3 (Debian keeps the `spring3` names) with Jackson, on Tomcat 9.
const SPRING_JARS: &[&str] = &[
    "/usr/share/java/spring3-core.jar",
    "/usr/share/java/spring3-beans.jar",
    "/usr/share/java/spring3-context.jar",
    "/usr/share/java/spring3-aop.jar",
    "/usr/share/java/spring3-expression.jar",
    "/usr/share/java/spring3-web.jar",
    "/usr/share/java/spring3-web.servlet.jar",
    "/usr/share/java/commons-logging.jar",
    "/usr/share/java/jackson-core.jar",
    "/usr/share/java/jackson-databind.jar",
    "/usr/share/java/jackson-annotations.jar",
    "/usr/share/java/tomcat9-catalina.jar",
    "/usr/share/java/tomcat9-coyote.jar",
    "/usr/share/java/tomcat9-util.jar",
    "/usr/share/java/tomcat9-util-scan.jar",
    "/usr/share/java/tomcat9-juli.jar",
    "/usr/share/java/tomcat9-api.jar",
    "/usr/share/java/tomcat9-jaspic-api.jar",
    "/usr/share/java/tomcat9-annotations-api.jar",
    "/usr/share/java/tomcat9-servlet-api.jar",
    "/usr/share/java/tomcat9-jni.jar",
];

fn apps_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("apps")
}

/// Whether the Debian packages are there; else fails (or skips, if asked to).
fn have_packages(paths: &[&str], packages: &str) -> bool {
    let missing: Vec<&&str> = paths.iter().filter(|p| !Path::new(p).exists()).collect();
    if missing.is_empty() {
        return true;
    }
    skip_or_fail(
        "real-apps",
        &format!("{missing:?} missing: install {packages} (cargo xtask test does)"),
    );
    false
}

/// The JDKs `app` runs on: one of 17 (Debian's, the most deployed) and the JDK of the day (one
/// of 25, 26 and 27, [`major_of_the_day`]) among those `runs_on` keeps, the two taking turns by
/// the day and the application, so that each day runs both and every application meets both
/// within two days (each real application takes about half a minute per JDK: every JDK for
/// every application on every run is too long for CI). `PROFILER_REAL_APP_JDKS` lists the
/// majors to run every application on instead.
fn real_app_jdks(app: &str, runs_on: impl Fn(&Jdk) -> bool) -> Vec<Jdk> {
    let available: Vec<Jdk> = jdks().into_iter().filter(|jdk| runs_on(jdk)).collect();
    if std::env::var_os("PROFILER_REAL_APP_JDKS").is_some() {
        let wanted = majors_from_env("PROFILER_REAL_APP_JDKS", &[]);
        println!("{app}: on JDK {wanted:?} (PROFILER_REAL_APP_JDKS)");
        return available
            .into_iter()
            .filter(|jdk| wanted.contains(&jdk.major))
            .collect();
    }
    let of_the_day = major_of_the_day(&[25, 26, 27]);
    let mut candidates: Vec<Jdk> = available
        .into_iter()
        .filter(|jdk| [17, of_the_day].contains(&jdk.major))
        .collect();
    if candidates.is_empty() {
        return candidates;
    }
    // Neighbours in this list take different JDKs on the same day.
    const TAKING_TURNS: [&str; 4] = ["h2", "clojure", "jetty", "spring"];
    let position = TAKING_TURNS.iter().position(|a| *a == app).unwrap_or(0) as u64;
    let turn = days_since_epoch() + position;
    let chosen = candidates.swap_remove((turn % candidates.len() as u64) as usize);
    println!(
        "{app}: on JDK {} today (17 and {of_the_day} take turns; PROFILER_REAL_APP_JDKS to choose)",
        chosen.major
    );
    vec![chosen]
}

/// Where a test keeps its recordings and profiles: a temporary directory, or a directory under
/// `PROFILER_REAL_APP_KEEP` that stays for inspection (`jfr`, `go tool pprof`).
struct WorkDir {
    _temp: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl WorkDir {
    fn new() -> Self {
        match std::env::var_os("PROFILER_REAL_APP_KEEP") {
            Some(root) => {
                let path = PathBuf::from(root).join(format!(
                    "run-{}-{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis())
                ));
                std::fs::create_dir_all(&path).expect("PROFILER_REAL_APP_KEEP directory");
                eprintln!("keeping recordings and profiles in {}", path.display());
                Self { _temp: None, path }
            }
            None => {
                let temp = tempfile::tempdir().expect("tempdir");
                let path = temp.path().to_owned();
                Self {
                    _temp: Some(temp),
                    path,
                }
            }
        }
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

fn targets_asserted() -> bool {
    std::env::var("PROFILER_REAL_APP_TARGETS").map_or(true, |v| v != "0")
}

/// One application: how to start it (after the JVM flags) and drive it.
struct App {
    name: &'static str,
    /// Arguments after the JVM's own flags: class path, main class, the program's arguments.
    args: Vec<String>,
    /// Whether the program prints a line "ready" once it serves or works.
    prints_ready: bool,
    /// Load drivers, started once the program is ready (killed at the end).
    load: Option<Box<dyn Fn() -> Vec<Workload>>>,
}

#[test]
fn real_app_h2_database() {
    if !have_packages(&[H2_JAR], "libh2-java") {
        return;
    }
    let dir = WorkDir::new();
    // The schema, then rounds of inserts, joins, aggregates and deletes (about 1.4 s of CPU each
    // on this machine): more rounds than the run lasts, so it is stopped while still working.
    let setup = std::fs::read_to_string(apps_dir().join("h2/setup.sql")).expect("setup.sql");
    let round = std::fs::read_to_string(apps_dir().join("h2/round.sql")).expect("round.sql");
    let script = dir.path().join("h2-workload.sql");
    std::fs::write(&script, setup + &round.repeat(300)).expect("script written");
    let app = App {
        name: "h2",
        args: vec![
            "-cp".into(),
            H2_JAR.into(),
            "org.h2.tools.RunScript".into(),
            "-url".into(),
            "jdbc:h2:mem:corpus".into(),
            "-script".into(),
            script.display().to_string(),
        ],
        prints_ready: false,
        load: None,
    };
    run_app(&app, dir.path());
}

#[test]
fn real_app_clojure_program() {
    if !have_packages(&[CLOJURE_JAR], "clojure") {
        return;
    }
    let dir = WorkDir::new();
    let seconds = WARM_UP_SECS + WINDOW_SECS + 20;
    let app = App {
        name: "clojure",
        args: vec![
            "-cp".into(),
            CLOJURE_JAR.into(),
            "clojure.main".into(),
            apps_dir()
                .join("clojure/workload.clj")
                .display()
                .to_string(),
            seconds.to_string(),
        ],
        prints_ready: true,
        load: None,
    };
    run_app(&app, dir.path());
}

#[test]
fn real_app_jetty_server() {
    let mut needed = JETTY_JARS.to_vec();
    needed.push("/usr/bin/ab");
    if !have_packages(&needed, "libjetty9-java apache2-utils") {
        return;
    }
    let dir = WorkDir::new();
    let classes = compile_app("jetty/JettyApp.java", JETTY_JARS, dir.path());
    let port = free_local_address().expect("a free port").port();
    let class_path = format!("{}:{}", classes.display(), JETTY_JARS.join(":"));
    let base = format!("http://127.0.0.1:{port}");
    let app = App {
        name: "jetty",
        args: vec![
            "-cp".into(),
            class_path,
            "JettyApp".into(),
            port.to_string(),
            dir.path().join("static").display().to_string(),
        ],
        prints_ready: true,
        load: Some(Box::new(move || {
            // The two servlets and a static file Jetty gzips.
            ab_clients(&[
                AbClient::get(2, format!("{base}/search?q=stack")),
                AbClient::get(2, format!("{base}/report?orders=2000")),
                AbClient::get(1, format!("{base}/table.html")).gzip(),
            ])
        })),
    };
    run_app(&app, dir.path());
}

#[test]
fn real_app_spring_server() {
    run_spring(false);
}

/// The Spring application with every request on a virtual thread of its own (JDK 21+), on the
/// run's JDKs that have them: its stacks are virtual threads' (rooted at
/// `VirtualThread.run`, their frames partly frozen in their stack chunks when sampled), its
/// lock waits unmounts.
#[test]
fn real_app_spring_on_virtual_threads() {
    run_spring(true);
}

/// The Spring application under `ab`, its requests on platform threads (Tomcat's pool) or on
/// virtual threads.
fn run_spring(on_virtual_threads: bool) {
    let mut needed = SPRING_JARS.to_vec();
    needed.push("/usr/bin/ab");
    if !have_packages(
        &needed,
        "libspring-web-servlet-java libtomcat9-java libjackson2-databind-java apache2-utils",
    ) {
        return;
    }
    let dir = WorkDir::new();
    let classes = compile_app("spring/SpringApp.java", SPRING_JARS, dir.path());
    let port = free_local_address().expect("a free port").port();
    let class_path = format!("{}:{}", classes.display(), SPRING_JARS.join(":"));
    let base = format!("http://127.0.0.1:{port}");
    let quote = dir.path().join("quote.json");
    std::fs::write(&quote, SPRING_QUOTE).expect("quote.json written");
    let mut args = vec![
        "-cp".into(),
        class_path,
        "SpringApp".into(),
        port.to_string(),
        dir.path().join("tomcat").display().to_string(),
    ];
    if on_virtual_threads {
        args.push("virtual".into());
    }
    let app = App {
        name: if on_virtual_threads {
            "spring-virtual"
        } else {
            "spring"
        },
        args,
        prints_ready: true,
        load: Some(Box::new(move || {
            // JSON posted and priced, and a summary read: both through Spring's dispatcher and
            // Jackson, the first also through its request-body reading.
            ab_clients(&[
                AbClient::get(2, format!("{base}/customers/7/summary?top=5")),
                AbClient::post_json(2, format!("{base}/quote"), quote.clone()),
            ])
        })),
    };
    run_app_on(&app, dir.path(), |jdk| {
        !on_virtual_threads || jdk.major >= 21
    });
}

/// A quote request the Spring application prices.
const SPRING_QUOTE: &str = r#"{"customer":"c-17","lines":[
{"sku":"sku-1","quantity":3,"day":"2026-02-01"},{"sku":"sku-44","quantity":1,"day":"2026-02-01"},
{"sku":"sku-90","quantity":7,"day":"2026-03-11"},{"sku":"sku-12","quantity":2,"day":"2026-04-01"},
{"sku":"sku-3","quantity":5,"day":"2026-05-21"},{"sku":"sku-77","quantity":4,"day":"2026-06-30"}]}"#;

/// Compiles one application's source (under tests/apps) against `jars`; returns its classes.
fn compile_app(source: &str, jars: &[&str], dir: &Path) -> PathBuf {
    let classes = dir.join("classes");
    std::fs::create_dir_all(&classes).expect("classes dir");
    let status = Command::new("/usr/lib/jvm/java-17-openjdk-amd64/bin/javac")
        .args(["--release", "11", "-g", "-cp", &jars.join(":"), "-d"])
        .arg(&classes)
        .arg(apps_dir().join(source))
        .status()
        .expect("javac runs");
    assert!(status.success(), "javac failed on {source}");
    classes
}

/// One `ab` load client: keep-alive requests to one URL, `concurrency` at a time.
struct AbClient {
    concurrency: u32,
    url: String,
    gzip: bool,
    json_body: Option<PathBuf>,
}

impl AbClient {
    fn get(concurrency: u32, url: String) -> Self {
        Self {
            concurrency,
            url,
            gzip: false,
            json_body: None,
        }
    }

    fn post_json(concurrency: u32, url: String, body: PathBuf) -> Self {
        Self {
            json_body: Some(body),
            ..Self::get(concurrency, url)
        }
    }

    fn gzip(self) -> Self {
        Self { gzip: true, ..self }
    }
}

/// Starts `clients`, each for the whole run (`-t` bounds it; they are killed at the end).
fn ab_clients(clients: &[AbClient]) -> Vec<Workload> {
    let total = (WARM_UP_SECS + WINDOW_SECS + 30).to_string();
    clients
        .iter()
        .map(|client| {
            let mut ab = Command::new("ab");
            let concurrency = client.concurrency.to_string();
            ab.args([
                "-q",
                "-k",
                "-c",
                &concurrency,
                "-t",
                &total,
                "-n",
                "100000000",
            ]);
            if client.gzip {
                ab.args(["-H", "Accept-Encoding: gzip"]);
            }
            if let Some(body) = &client.json_body {
                ab.arg("-T").arg("application/json").arg("-p").arg(body);
            }
            ab.arg(&client.url).stderr(Stdio::null());
            Workload::spawn(&mut ab).expect("ab starts")
        })
        .collect()
}

/// Runs `app` on each JDK, prints every figure, and asserts the harness (and, when asked, the
/// targets) once all JDKs ran.
fn run_app(app: &App, dir: &Path) {
    run_app_on(app, dir, |_| true);
}

/// [`run_app`] on the run's JDKs that `runs_on` keeps.
fn run_app_on(app: &App, dir: &Path, runs_on: impl Fn(&Jdk) -> bool) {
    let helper =
        compile_java_for(&["JfrSamples.java"], &dir.join("helper"), "11").expect("javac helper");
    let extra_jfc = dir.join("extra-events.jfc");
    std::fs::write(&extra_jfc, EXTRA_EVENTS_JFC).expect("extra-events.jfc written");
    let mut summaries = Vec::new();
    let mut harness_failures = Vec::new();
    let mut target_failures = Vec::new();
    for jdk in real_app_jdks(app.name, runs_on) {
        let started = Instant::now();
        match measure(app, &jdk, dir, &helper, &extra_jfc) {
            Ok(m) => {
                let report = m.report();
                eprintln!("{report}");
                summaries.push(m.summary_line());
                harness_failures.extend(m.harness_failures());
                target_failures.extend(m.target_failures());
            }
            Err(err) => harness_failures.push(format!("{} JDK {}: {err:#}", app.name, jdk.major)),
        }
        eprintln!(
            "{} JDK {}: measured in {:.1} s",
            app.name,
            jdk.major,
            started.elapsed().as_secs_f64()
        );
    }
    eprintln!("--- summary: {} ---\n{}", app.name, summaries.join("\n"));
    if !target_failures.is_empty() {
        eprintln!(
            "--- targets missed ({}) ---\n{}",
            if targets_asserted() {
                "asserted; PROFILER_REAL_APP_TARGETS=0 only reports them"
            } else {
                "reported only: PROFILER_REAL_APP_TARGETS=0"
            },
            target_failures.join("\n")
        );
    }
    assert!(
        harness_failures.is_empty(),
        "harness failed:\n{}",
        harness_failures.join("\n")
    );
    if targets_asserted() {
        assert!(
            target_failures.is_empty(),
            "targets missed:\n{}",
            target_failures.join("\n")
        );
    }
}

/// A child sent SIGTERM, then killed if it has not exited within `timeout`.
fn terminate(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    // SAFETY: kill has no memory preconditions; the pid is our child's, not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// The JVM under test, killed if a failure leaves it running.
struct Jvm(Child);

impl Drop for Jvm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The daemon's `profiler_alloc_*` counters: (from `before` to `after`, `after`).
fn alloc_counters(before: &str, after: &str) -> BTreeMap<String, (f64, f64)> {
    let before = metrics_endpoint::parse(before);
    metrics_endpoint::parse(after)
        .into_iter()
        .filter(|(key, _)| key.starts_with("profiler_alloc_"))
        .map(|(key, after)| {
            let window = after - before.get(&key).copied().unwrap_or(0.0);
            (key, (window, after))
        })
        .collect()
}

fn unwind_ends(page: &str) -> BTreeMap<String, u64> {
    page.lines()
        .filter_map(|line| {
            let rest = line
                .strip_prefix(metric::UNWIND_ENDS)?
                .strip_prefix("{reason=\"")?;
            let (reason, value) = rest.split_once("\"} ")?;
            Some((reason.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// Starts the JVM with JFR and the daemon on it, runs the window, and reads both profilers.
fn measure(
    app: &App,
    jdk: &Jdk,
    dir: &Path,
    helper: &Path,
    extra_jfc: &Path,
) -> anyhow::Result<Measurement> {
    use anyhow::{bail, Context as _};
    let tag = format!("{}-jdk{}", app.name, jdk.major);
    let jfr_file = dir.join(format!("{tag}.jfr"));
    let out = dir.join(format!("{tag}-profiles"));
    let logs = dir.join(format!("{tag}-logs"));
    std::fs::create_dir_all(&logs)?;
    let jvm_log = logs.join("jvm-stderr.log");

    let started = Instant::now();
    let mut jvm = Jvm(Command::new(&jdk.java)
        .args([
            "-Xmx1g",
            "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+DebugNonSafepoints",
            "-XX:FlightRecorderOptions=stackdepth=2048",
        ])
        .arg(format!(
            "-XX:StartFlightRecording=delay={WARM_UP_SECS}s,filename={},dumponexit=true,settings=profile,settings={}",
            jfr_file.display(),
            extra_jfc.display()
        ))
        .args(&app.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&jvm_log)?)
        .spawn()
        .with_context(|| format!("starting {}", jdk.java.display()))?);
    let pid = jvm.0.id();
    // The program's output, drained so it never blocks; its "ready" line reported.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let stdout = jvm.0.stdout.take().context("JVM stdout")?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.trim() == "ready" {
                let _ = ready_tx.send(());
            }
        }
    });

    let metrics = free_local_address()?;
    let daemon = DaemonRun::new()
        .pid(pid)
        .frequency(FREQUENCY_HZ)
        .interval(INTERVAL_SECS)
        .output(&out)
        .metrics(metrics)
        .arg("--alloc")
        .arg(LOCK_THRESHOLD)
        .try_start(&logs)?;
    if app.prints_ready {
        ready_rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| {
                anyhow::anyhow!(
                    "{tag}: the program never printed \"ready\" (see {})",
                    jvm_log.display()
                )
            })?;
    }
    let _load = app.load.as_ref().map(|start| start()).unwrap_or_default();
    let ready_after = started.elapsed();

    // Counters at the start of JFR's recording, to report the window's own unwind ends.
    std::thread::sleep(
        Duration::from_secs(WARM_UP_SECS).saturating_sub(started.elapsed())
            + Duration::from_millis(500),
    );
    let page_before = scrape_metrics(metrics).unwrap_or_default();
    let ends_before = unwind_ends(&page_before);

    // JFR records until the JVM exits, and writes its file then (`dumponexit`): the daemon's
    // last interval, ended first, lies inside JFR's recording.
    std::thread::sleep(
        Duration::from_secs(WARM_UP_SECS + WINDOW_SECS).saturating_sub(started.elapsed()),
    );
    if let Some(status) = jvm.0.try_wait()? {
        bail!(
            "{tag}: the JVM exited ({status}) before the window ended: {}",
            std::fs::read_to_string(&jvm_log).unwrap_or_default()
        );
    }
    let ran_through = jvm.0.try_wait()?.is_none();
    // Every mapping the window's stacks could point into (thread stacks included).
    let regions = Regions::of(pid);
    let page = scrape_metrics(metrics)?;
    let ends_after = unwind_ends(&page);
    let alloc_counters = alloc_counters(&page_before, &page);
    daemon.terminate();
    let (status, _log) = daemon.wait(Duration::from_secs(60))?;
    if !status.success() {
        bail!("{tag}: daemon exited with {status}");
    }
    drop(_load);
    // An orderly exit lets JFR finish its file.
    terminate(&mut jvm.0, Duration::from_secs(30));

    let jfr = read_jfr(jdk, helper, &jfr_file)?;
    let all_profiles = profiles_of(&out, pid)?;
    let of_kind = |prefix: &str| -> Vec<&profiler_daemon::pprof::proto::Profile> {
        all_profiles
            .iter()
            .filter(|(path, _)| {
                path.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(prefix))
            })
            .map(|(_, profile)| profile)
            .collect()
    };
    let profiles = of_kind("cpu-");
    let alloc_profiles = of_kind("alloc-");
    let lock_profiles = [
        (LockKind::MonitorEnter, "mutex-"),
        (LockKind::Park, "block-"),
    ];
    let mut m = Measurement::new(app.name, jdk.major);
    m.ran_through = ran_through;
    m.ready_after = ready_after;
    m.jfr_summary_count = jfr.summary_count;
    m.jfr_parsed = jfr.samples.len();
    m.jfr_alloc_summary = jfr.alloc_summary;
    for alloc in &jfr.allocs {
        m.jfr_alloc_parsed[alloc.kind as usize] += 1;
    }
    m.alloc_counters = alloc_counters;
    // JFR's window: its first and last sample. The daemon's profiles inside it count, and JFR's
    // samples inside those profiles.
    let (Some(first), Some(last)) = (
        jfr.samples.iter().map(|s| s.nanos).min(),
        jfr.samples.iter().map(|s| s.nanos).max(),
    ) else {
        bail!("{tag}: JFR recorded no execution sample");
    };
    let slack = 200_000_000; // JFR's first sample comes up to a period after the start
    let mut window: Option<(i64, i64)> = None;
    for profile in &profiles {
        let (start, end) = (
            profile.time_nanos,
            profile.time_nanos + profile.duration_nanos,
        );
        if start + slack < first || end > last + slack {
            continue;
        }
        window = Some(match window {
            None => (start, end),
            Some((a, b)) => (a.min(start), b.max(end)),
        });
        m.add_profile(profile, &regions);
    }
    let Some((from, to)) = window else {
        bail!(
            "{tag}: no daemon profile inside JFR's window ({} profiles written)",
            profiles.len()
        );
    };
    m.window_secs = (to - from) as f64 / 1e9;
    for sample in jfr
        .samples
        .iter()
        .filter(|s| s.nanos >= from && s.nanos < to)
    {
        m.add_jfr(sample);
    }
    // The allocation profiles of the same intervals (the daemon ends every kind's interval at
    // once), and JFR's allocation events inside them; without the slack: an allocation profile
    // counts only if JFR recorded over all of it, since allocation comes in bursts (H2 on JDK
    // 17: 135 MB, 3% of the window's bytes, in 160 ms of a profile past JFR's last event, when
    // JFR stopped before the daemon).
    let jfr_events = || {
        jfr.samples
            .iter()
            .map(|s| s.nanos)
            .chain(jfr.allocs.iter().map(|a| a.nanos))
    };
    let (recorded_from, recorded_to) = (
        jfr_events().min().unwrap_or(first),
        jfr_events().max().unwrap_or(last),
    );
    let mut alloc_window: Option<(i64, i64)> = None;
    for profile in alloc_profiles {
        let (start, end) = (
            profile.time_nanos,
            profile.time_nanos + profile.duration_nanos,
        );
        if start < recorded_from.max(from - 1_000_000) || end > recorded_to.min(to + 1_000_000) {
            continue;
        }
        alloc_window = Some(match alloc_window {
            None => (start, end),
            Some((a, b)) => (a.min(start), b.max(end)),
        });
        m.add_alloc_profile(profile);
    }
    if let Some((from, to)) = alloc_window {
        m.alloc_window_secs = (to - from) as f64 / 1e9;
        m.jfr_alloc = jfr
            .allocs
            .into_iter()
            .filter(|a| a.nanos >= from && a.nanos < to)
            .collect();
    }
    // The lock profiles of the same intervals, as the allocation profiles; JFR's lock events
    // that ended inside them.
    m.lock.jfr_summary = jfr.lock_summary;
    for lock in &jfr.locks {
        m.lock.jfr_parsed[lock.kind as usize] += 1;
    }
    let mut lock_window: Option<(i64, i64)> = None;
    for (kind, prefix) in lock_profiles {
        for profile in of_kind(prefix) {
            let (start, end) = (
                profile.time_nanos,
                profile.time_nanos + profile.duration_nanos,
            );
            if start < recorded_from.max(from - 1_000_000) || end > recorded_to.min(to + 1_000_000)
            {
                continue;
            }
            lock_window = Some(match lock_window {
                None => (start, end),
                Some((a, b)) => (a.min(start), b.max(end)),
            });
            m.lock.add_profile(kind, profile);
        }
    }
    if let Some((from, to)) = lock_window {
        m.lock.window_secs = (to - from) as f64 / 1e9;
        m.lock.add_jfr(&jfr.locks, from, to);
    }
    m.ends = ends_after
        .iter()
        .map(|(reason, after)| {
            let before = ends_before.get(reason).copied().unwrap_or(0);
            (reason.clone(), (after.saturating_sub(before), *after))
        })
        .collect();
    Ok(m)
}

/// Where addresses of `[unknown]` frames are: the JVM's code heaps as `jvm-info` reads them (the
/// heap holding the interpreter being the one of stubs and adapters), else the mapping of
/// `/proc/PID/maps` that holds them. Read while the JVM runs.
struct Regions {
    heaps: Vec<(u64, u64, &'static str)>,
    maps: Vec<(u64, u64, String)>,
}

impl Regions {
    fn of(pid: u32) -> Self {
        let mut heaps = Vec::new();
        if let Ok(info) = jvm_info_json(pid) {
            let cache = &info["code_cache"];
            let interpreter = cache["interpreter_low"].as_u64().unwrap_or(0);
            for heap in cache["heaps"].as_array().into_iter().flatten() {
                if let (Some(low), Some(high)) = (heap["low"].as_u64(), heap["high"].as_u64()) {
                    let what = if (low..high).contains(&interpreter) {
                        "in the non-nmethod code heap"
                    } else {
                        "in an nmethod code heap"
                    };
                    heaps.push((low, high, what));
                }
            }
        }
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            .unwrap_or_default()
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let (low, high) = fields.next()?.split_once('-')?;
                let perms = fields.next()?;
                let path = fields.nth(3).unwrap_or("anonymous");
                Some((
                    u64::from_str_radix(low, 16).ok()?,
                    u64::from_str_radix(high, 16).ok()?,
                    format!("{perms} {path}"),
                ))
            })
            .collect();
        Self { heaps, maps }
    }

    /// `[unknown] (where)` for an `[unknown]` frame at `address`.
    fn name(&self, address: u64) -> String {
        if self.heaps.is_empty() && self.maps.is_empty() {
            return "[unknown]".to_owned();
        }
        if let Some((_, _, what)) = self
            .heaps
            .iter()
            .find(|(low, high, _)| (*low..*high).contains(&address))
        {
            return format!("[unknown] ({what})");
        }
        if address < 0x10000 {
            return "[unknown] (near address 0)".to_owned();
        }
        match self
            .maps
            .iter()
            .find(|(low, high, _)| (*low..*high).contains(&address))
        {
            Some((_, _, what)) => format!("[unknown] (outside the code cache: {what})"),
            None => "[unknown] (outside the code cache: unmapped)".to_owned(),
        }
    }
}

/// What a frame of our profiles is, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Kernel,
    /// A Java frame: compiled (C2 or other), C1, inlined, interpreted.
    Jit,
    C1,
    Inlined,
    Interpreted,
    /// A Java frame the daemon could not name (`[unknown java method]_[j]`, `[unknown java
    /// frame]`, `[unknown compiled frame]`).
    UnknownJava,
    /// `[unknown]`: anonymous memory no symbol covers.
    Unknown,
    /// `[truncated: reason]`.
    Truncated,
    /// A named code blob that is not a method: `[vtable chunks]`, `[StubRoutines (1)]`, ...
    Stub,
    /// A native function.
    Native,
}

impl Kind {
    fn of(name: &str) -> Self {
        if name.ends_with("_[k]") {
            Kind::Kernel
        } else if name.starts_with("[truncated: ") {
            Kind::Truncated
        } else if name.starts_with("[unknown java") || name.starts_with("[unknown compiled") {
            Kind::UnknownJava
        } else if name == "[unknown]" || name.starts_with("[unknown] (") {
            Kind::Unknown
        } else if name.ends_with("_[j]") {
            Kind::Jit
        } else if name.ends_with("_[1]") {
            Kind::C1
        } else if name.ends_with("_[i]") {
            Kind::Inlined
        } else if name.ends_with("_[0]") {
            Kind::Interpreted
        } else if name.starts_with('[') && name.ends_with(']') {
            Kind::Stub
        } else {
            Kind::Native
        }
    }

    fn is_java(self) -> bool {
        matches!(
            self,
            Kind::Jit | Kind::C1 | Kind::Inlined | Kind::Interpreted | Kind::UnknownJava
        )
    }

    fn is_lost(self) -> bool {
        matches!(self, Kind::UnknownJava | Kind::Unknown | Kind::Truncated)
    }
}

/// A frame described by its kind, for grouping lost stacks (method names only where the set
/// is small: stubs and java.lang.invoke).
fn describe(name: &str) -> String {
    let kind = Kind::of(name);
    let base = base_name(name);
    match kind {
        Kind::Stub | Kind::Unknown | Kind::UnknownJava | Kind::Truncated => name.to_owned(),
        _ if base.starts_with("java.lang.invoke.") => {
            format!("{} ({kind:?})", base.split("$$").next().unwrap_or(base))
        }
        Kind::Native => "native".to_owned(),
        Kind::Kernel => "kernel".to_owned(),
        _ => format!("{kind:?} method"),
    }
}

/// One of our samples, reduced to what the figures need.
struct Sample {
    count: i64,
    thread: String,
    frames: Vec<String>,
    /// The source line of the innermost frame, if it is a Java frame: 0 where the compiled
    /// method has no debug information at that pc (its prologue, epilogue or stub section).
    leaf_line: Option<i64>,
}

/// Everything measured for one application on one JDK.
struct Measurement {
    app: &'static str,
    jdk: u32,
    ran_through: bool,
    ready_after: Duration,
    window_secs: f64,
    profiles: usize,
    jfr_summary_count: Option<u64>,
    jfr_parsed: usize,
    samples: Vec<Sample>,
    jfr: Vec<JfrSample>,
    /// reason -> (during JFR's window, whole run)
    ends: BTreeMap<String, (u64, u64)>,
    /// Our allocation profiles inside the window, and their span.
    alloc_profiles: usize,
    alloc_window_secs: f64,
    /// Their sampling interval (`--alloc`'s, their period).
    alloc_interval: i64,
    allocs: Vec<AllocSample>,
    /// JFR's allocation events inside the allocation profiles' window.
    jfr_alloc: Vec<JfrAlloc>,
    /// JFR's allocation events read, and `jfr summary`'s counts, per [`AllocKind`].
    jfr_alloc_parsed: [usize; 2],
    jfr_alloc_summary: [Option<u64>; 2],
    /// `profiler_alloc_*` -> (from just after JFR's start to its end, whole run).
    alloc_counters: BTreeMap<String, (f64, f64)>,
    lock: LockComparison,
}

/// One sample of our allocation profiles: estimated events and bytes per [`AllocKind`].
struct AllocSample {
    events: [i64; 2],
    bytes: [i64; 2],
    frames: Vec<String>,
}

impl AllocSample {
    fn bytes(&self) -> i64 {
        self.bytes.iter().sum()
    }
}

/// What both profilers say of one allocation site (or one kind of event) over the window.
#[derive(Clone, Debug, Default)]
struct AllocTally {
    /// Our estimated bytes.
    ours: i64,
    /// JFR's bytes (every event) and events.
    jfr: i64,
    jfr_events: i64,
    /// The variance of our estimate of these bytes, from JFR's events (the same events the
    /// daemon sampled): an event of `w` bytes below the interval `I` is taken with
    /// probability `w / I` and then counts `I`, a variance of `w (I - w)`; a larger one is
    /// always taken and counts itself.
    variance: f64,
    /// The variance of our estimated events: such an event counts `I / w` events when taken,
    /// a variance of `I / w - 1`.
    event_variance: f64,
}

impl AllocTally {
    fn add_jfr(&mut self, bytes: i64, interval: i64) {
        self.jfr += bytes;
        self.jfr_events += 1;
        if bytes < interval {
            self.variance += bytes as f64 * (interval - bytes) as f64;
            self.event_variance += interval as f64 / bytes.max(1) as f64 - 1.0;
        }
    }
}

/// One row of a site comparison (allocation sites' byte shares, lock sites' shares of waits):
/// a site's share in our profiles and in JFR's events.
struct SiteRow {
    site: String,
    ours: f64,
    jfr: f64,
    /// Standard error of the difference.
    sigma: f64,
    /// What is allowed beyond 3 standard errors (what sampling noise does not explain).
    slack_pp: f64,
    /// Whether the site is among those whose difference is asserted.
    asserted: bool,
}

impl SiteRow {
    fn diff_pp(&self) -> f64 {
        (self.ours - self.jfr) * 100.0
    }

    fn allowed_pp(&self) -> f64 {
        3.0 * self.sigma * 100.0 + self.slack_pp
    }
}

/// The index of `profile`'s sample type named `name`.
fn sample_type(profile: &profiler_daemon::pprof::proto::Profile, name: &str) -> Option<usize> {
    profile
        .sample_type
        .iter()
        .position(|t| profile.string_table[t.r#type as usize] == name)
}

/// A profile's frame names per sample, through its locations and functions by id: allocation
/// and lock profiles have thousands of samples of deep stacks, too many for `sample_frames`'
/// search of every location per frame.
struct FrameNames<'a> {
    locations: HashMap<u64, &'a profiler_daemon::pprof::proto::Location>,
    functions: HashMap<u64, &'a str>,
}

impl<'a> FrameNames<'a> {
    fn of(profile: &'a profiler_daemon::pprof::proto::Profile) -> Self {
        Self {
            locations: profile.location.iter().map(|l| (l.id, l)).collect(),
            functions: profile
                .function
                .iter()
                .map(|f| (f.id, profile.string_table[f.name as usize].as_str()))
                .collect(),
        }
    }

    /// The sample's frames, innermost first (an unknown function as "").
    fn frames<'s>(
        &'s self,
        sample: &'s profiler_daemon::pprof::proto::Sample,
    ) -> impl Iterator<Item = &'a str> + 's {
        sample
            .location_id
            .iter()
            .filter_map(|id| self.locations.get(id))
            .flat_map(|location| &location.line)
            .map(|line| {
                self.functions
                    .get(&line.function_id)
                    .copied()
                    .unwrap_or_default()
            })
    }
}

/// Allocation sites: 3 pp beyond the noise (see [`Measurement::alloc_target_failures`]).
const ALLOC_SITE_SLACK_PP: f64 = 3.0;

/// Shares of a distribution.
struct Distribution {
    total: i64,
    counts: HashMap<String, i64>,
}

impl Distribution {
    fn share(&self, key: &str) -> f64 {
        self.counts.get(key).copied().unwrap_or(0) as f64 / self.total.max(1) as f64
    }

    fn top(&self, n: usize) -> Vec<String> {
        let mut entries: Vec<(&String, &i64)> = self.counts.iter().collect();
        entries.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        entries
            .into_iter()
            .take(n)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// One row of the leaf-method comparison.
struct LeafRow {
    method: String,
    ours: f64,
    jfr: f64,
    /// Standard error of the difference (binomial, both samples independent).
    sigma: f64,
}

impl LeafRow {
    fn diff_pp(&self) -> f64 {
        (self.ours - self.jfr) * 100.0
    }
}

const NO_JAVA_FRAME: &str = "(no Java frame)";

/// Lost-stack signature -> (samples, samples per thread group).
type Signatures = BTreeMap<String, (i64, BTreeMap<String, i64>)>;

impl Measurement {
    fn new(app: &'static str, jdk: u32) -> Self {
        Self {
            app,
            jdk,
            ran_through: false,
            ready_after: Duration::ZERO,
            window_secs: 0.0,
            profiles: 0,
            jfr_summary_count: None,
            jfr_parsed: 0,
            samples: Vec::new(),
            jfr: Vec::new(),
            ends: BTreeMap::new(),
            alloc_profiles: 0,
            alloc_window_secs: 0.0,
            alloc_interval: DEFAULT_ALLOC_INTERVAL,
            allocs: Vec::new(),
            jfr_alloc: Vec::new(),
            jfr_alloc_parsed: [0; 2],
            jfr_alloc_summary: [None; 2],
            alloc_counters: BTreeMap::new(),
            lock: LockComparison::default(),
        }
    }

    /// Adds an allocation profile's samples: estimated events and bytes per kind, by the
    /// sample types' names.
    fn add_alloc_profile(&mut self, profile: &profiler_daemon::pprof::proto::Profile) {
        self.alloc_profiles += 1;
        if profile.period > 0 {
            self.alloc_interval = profile.period;
        }
        let columns = AllocKind::ALL.map(|kind| {
            (
                sample_type(profile, &format!("alloc_{}_objects", kind.name())),
                sample_type(profile, &format!("alloc_{}_bytes", kind.name())),
            )
        });
        let names = FrameNames::of(profile);
        for sample in &profile.sample {
            let value = |at: Option<usize>| at.and_then(|i| sample.value.get(i)).copied();
            self.allocs.push(AllocSample {
                events: columns.map(|(events, _)| value(events).unwrap_or(0)),
                bytes: columns.map(|(_, bytes)| value(bytes).unwrap_or(0)),
                frames: names.frames(sample).map(str::to_owned).collect(),
            });
        }
    }

    /// An allocation site of ours: the allocated class (the innermost frame) and the innermost
    /// Java method under it (stub and VM frames skipped).
    fn our_site(frames: &[String]) -> String {
        let class = frames.first().map_or("(no class)", |f| base_name(f));
        let method = frames
            .iter()
            .skip(1)
            .find(|f| Kind::of(f).is_java())
            .map_or(NO_JAVA_FRAME, |f| base_name(f));
        format!("{class} in {method}")
    }

    /// JFR's site of an allocation: its class, and its stack's innermost frame.
    fn jfr_site(alloc: &JfrAlloc) -> String {
        let method = alloc.method.as_deref().unwrap_or(NO_JAVA_FRAME);
        format!("{} in {method}", alloc.class)
    }

    /// Both sides' bytes per allocation site, and in all.
    fn alloc_sites(&self) -> (BTreeMap<String, AllocTally>, AllocTally) {
        let mut sites: BTreeMap<String, AllocTally> = BTreeMap::new();
        let mut total = AllocTally::default();
        for sample in &self.allocs {
            let bytes = sample.bytes();
            sites
                .entry(Self::our_site(&sample.frames))
                .or_default()
                .ours += bytes;
            total.ours += bytes;
        }
        for alloc in &self.jfr_alloc {
            sites
                .entry(Self::jfr_site(alloc))
                .or_default()
                .add_jfr(alloc.bytes, self.alloc_interval);
            total.add_jfr(alloc.bytes, self.alloc_interval);
        }
        (sites, total)
    }

    /// Both sides' events and bytes per kind.
    fn alloc_kinds(&self) -> [AllocTally; 2] {
        let mut kinds: [AllocTally; 2] = Default::default();
        for sample in &self.allocs {
            for kind in AllocKind::ALL {
                kinds[kind as usize].ours += sample.bytes[kind as usize];
            }
        }
        for alloc in &self.jfr_alloc {
            kinds[alloc.kind as usize].add_jfr(alloc.bytes, self.alloc_interval);
        }
        kinds
    }

    /// Our estimated events per kind.
    fn our_alloc_events(&self) -> [i64; 2] {
        let mut events = [0; 2];
        for sample in &self.allocs {
            for kind in AllocKind::ALL {
                events[kind as usize] += sample.events[kind as usize];
            }
        }
        events
    }

    /// The sites in either side's top 10 by bytes, by JFR's share, largest first. JFR's
    /// share is exact (it recorded every event); ours estimates it from a sample of the same
    /// events: its standard error is the delta method's, from [`AllocTally::variance`], `B`
    /// JFR's bytes of all sites, `q` the site's share, `V_s` and `V` the variances of the
    /// site's and of all sites' estimates (sites independent):
    /// `sqrt(((1 - q)^2 V_s + q^2 (V - V_s)) / B^2)`, about `sqrt(q (1 - q) / n)` with `n` our
    /// samples (`B / I`) when events are small, less when many events exceed `I`.
    fn site_rows(&self) -> Vec<SiteRow> {
        let (sites, total) = self.alloc_sites();
        let top = |key: fn(&AllocTally) -> i64, whole: i64, n: usize| -> Vec<String> {
            let mut entries: Vec<(&String, &AllocTally)> =
                sites.iter().filter(|(_, t)| key(t) > 0).collect();
            entries.sort_by(|a, b| key(b.1).cmp(&key(a.1)).then(a.0.cmp(b.0)));
            entries
                .into_iter()
                .take(n)
                .filter(|(_, t)| {
                    n > ASSERTED_SITES || key(t) as f64 >= MIN_SITE_SHARE * whole as f64
                })
                .map(|(site, _)| site.clone())
                .collect()
        };
        let asserted: HashSet<String> = top(|t| t.jfr, total.jfr, ASSERTED_SITES)
            .into_iter()
            .chain(top(|t| t.ours, total.ours, ASSERTED_SITES))
            .collect();
        let mut shown = top(|t| t.jfr, total.jfr, 10);
        for site in top(|t| t.ours, total.ours, 10) {
            if !shown.contains(&site) {
                shown.push(site);
            }
        }
        let whole = total.jfr.max(1) as f64;
        let mut rows: Vec<SiteRow> = shown
            .into_iter()
            .map(|site| {
                let tally = &sites[&site];
                let q = tally.jfr as f64 / whole;
                let variance = ((1.0 - q).powi(2) * tally.variance
                    + q.powi(2) * (total.variance - tally.variance))
                    / (whole * whole);
                SiteRow {
                    ours: tally.ours as f64 / total.ours.max(1) as f64,
                    jfr: q,
                    // Of our share, given JFR's: JFR's events are the population sampled.
                    sigma: variance.max(0.0).sqrt(),
                    slack_pp: ALLOC_SITE_SLACK_PP,
                    asserted: asserted.contains(&site),
                    site,
                }
            })
            .collect();
        rows.sort_by(|a, b| b.jfr.total_cmp(&a.jfr).then(b.ours.total_cmp(&a.ours)));
        rows
    }

    /// Adds a profile's samples; `[unknown]` frames say where their address is (`regions`).
    fn add_profile(&mut self, profile: &profiler_daemon::pprof::proto::Profile, regions: &Regions) {
        self.profiles += 1;
        for sample in &profile.sample {
            let frames = sample_frames(profile, sample);
            let leaf_line = frames
                .iter()
                .find(|f| Kind::of(&f.name) != Kind::Kernel)
                .filter(|f| Kind::of(&f.name).is_java())
                .map(|f| f.line);
            self.samples.push(Sample {
                count: count(sample),
                leaf_line,
                thread: label(profile, sample, "thread_name")
                    .unwrap_or_default()
                    .to_owned(),
                frames: frames
                    .into_iter()
                    .map(|f| {
                        if f.name == "[unknown]" {
                            regions.name(f.address)
                        } else {
                            f.name
                        }
                    })
                    .collect(),
            });
        }
    }

    fn add_jfr(&mut self, sample: &JfrSample) {
        self.jfr.push(JfrSample {
            nanos: sample.nanos,
            truncated: sample.truncated,
            thread: sample.thread.clone(),
            frames: sample.frames.clone(),
        });
    }

    fn total(&self) -> i64 {
        self.samples.iter().map(|s| s.count).sum()
    }

    fn jfr_total(&self) -> i64 {
        self.jfr.len() as i64
    }

    /// (a) Samples with an unknown or truncated frame.
    fn lost(&self) -> i64 {
        self.samples
            .iter()
            .filter(|s| s.frames.iter().any(|f| Kind::of(f).is_lost()))
            .map(|s| s.count)
            .sum()
    }

    /// Thread entries: `Thread.run`, `Thread.runWith`, `main` methods, a virtual thread's
    /// `VirtualThread.run` (where the daemon ends its stack; JFR's go on to the continuation's
    /// `enterSpecial`), and the outermost frames of JFR's complete stacks that root at least
    /// 0.5% of them (JFR rarely records a stack cut short: `clojure.lang.LazySeq.hasheq` once in
    /// 3782 samples).
    fn entries(&self) -> HashSet<String> {
        let mut entries: HashSet<String> = [
            "java.lang.Thread.run",
            "java.lang.Thread.runWith",
            "java.lang.VirtualThread.run",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        let mut roots: HashMap<&str, usize> = HashMap::new();
        for sample in self.jfr.iter().filter(|s| !s.truncated) {
            if let Some((_, name)) = sample.frames.last() {
                *roots.entry(name).or_default() += 1;
            }
        }
        let enough = self.jfr.len() / 200;
        entries.extend(
            roots
                .into_iter()
                .filter(|(_, n)| *n > enough)
                .map(|(name, _)| name.to_owned()),
        );
        entries
    }

    fn is_entry(entries: &HashSet<String>, name: &str) -> bool {
        entries.contains(name) || name.ends_with(".main")
    }

    /// Whether a sample has Java frames and its outermost one is a thread entry, with no
    /// truncation or unknown frame on the way.
    fn rooted(entries: &HashSet<String>, frames: &[String]) -> bool {
        if frames.iter().any(|f| Kind::of(f).is_lost()) {
            return false;
        }
        frames
            .iter()
            .rev()
            .find(|f| Kind::of(f).is_java())
            .is_some_and(|f| Self::is_entry(entries, base_name(f)))
    }

    /// (b) (samples with Java frames, of which rooted).
    fn rooted_counts(&self) -> (i64, i64) {
        let entries = self.entries();
        let (mut with_java, mut rooted) = (0, 0);
        for sample in &self.samples {
            if !sample.frames.iter().any(|f| Kind::of(f).is_java()) {
                continue;
            }
            with_java += sample.count;
            if Self::rooted(&entries, &sample.frames) {
                rooted += sample.count;
            }
        }
        (with_java, rooted)
    }

    /// Whether the sample was taken in Java code (or in stubs, or where the walk failed): no
    /// native or kernel frame above the first Java frame. JFR's execution samples are of
    /// threads in Java code only, so only these compare with them.
    fn in_java(frames: &[String]) -> bool {
        let first_java = frames
            .iter()
            .position(|f| Kind::of(f).is_java())
            .unwrap_or(frames.len());
        !frames[..first_java]
            .iter()
            .any(|f| matches!(Kind::of(f), Kind::Native | Kind::Kernel))
    }

    /// The leaf-most compiled or interpreted method: inlined frames skipped.
    /// With `fold` false, the innermost Java frame, inlined or not.
    fn our_leaf(frames: &[String], fold: bool) -> String {
        frames
            .iter()
            .find(|f| Kind::of(f).is_java() && !(fold && Kind::of(f) == Kind::Inlined))
            .map_or_else(|| NO_JAVA_FRAME.to_owned(), |f| base_name(f).to_owned())
    }

    fn jfr_leaf(frames: &[(String, String)]) -> String {
        frames
            .iter()
            .find(|(kind, _)| kind != "Inlined")
            .map_or_else(|| NO_JAVA_FRAME.to_owned(), |(_, name)| name.clone())
    }

    /// Whether JFR tells inlined frames apart: JDK 11's marks every compiled frame "JIT
    /// compiled", so there both sides compare their innermost frames, unfolded.
    fn jfr_marks_inlined(&self) -> bool {
        self.jfr
            .iter()
            .any(|s| s.frames.iter().any(|(kind, _)| kind == "Inlined"))
    }

    /// (c) Our leaf methods (samples in Java code) and JFR's.
    fn leaf_distributions(&self) -> (Distribution, Distribution) {
        let mut ours = Distribution {
            total: 0,
            counts: HashMap::new(),
        };
        let fold = self.jfr_marks_inlined();
        for sample in self.samples.iter().filter(|s| Self::in_java(&s.frames)) {
            ours.total += sample.count;
            *ours
                .counts
                .entry(Self::our_leaf(&sample.frames, fold))
                .or_default() += sample.count;
        }
        let mut jfr = Distribution {
            total: 0,
            counts: HashMap::new(),
        };
        for sample in &self.jfr {
            jfr.total += 1;
            *jfr.counts
                .entry(Self::jfr_leaf(&sample.frames))
                .or_default() += 1;
        }
        (ours, jfr)
    }

    /// The methods in either side's top 10, by absolute difference.
    fn leaf_rows(&self) -> Vec<LeafRow> {
        let (ours, jfr) = self.leaf_distributions();
        let mut methods: Vec<String> = ours.top(10);
        for method in jfr.top(10) {
            if !methods.contains(&method) {
                methods.push(method);
            }
        }
        let mut rows: Vec<LeafRow> = methods
            .into_iter()
            .map(|method| {
                let (p, q) = (ours.share(&method), jfr.share(&method));
                let sigma = (p * (1.0 - p) / ours.total.max(1) as f64
                    + q * (1.0 - q) / jfr.total.max(1) as f64)
                    .sqrt();
                LeafRow {
                    method,
                    ours: p,
                    jfr: q,
                    sigma,
                }
            })
            .collect();
        rows.sort_by(|a, b| b.diff_pp().abs().total_cmp(&a.diff_pp().abs()));
        rows
    }

    /// (d) Samples that lost their stack: an unknown or truncated frame, or Java frames whose
    /// outermost is no thread entry. Their kind, and their signature.
    fn lost_stacks(&self) -> (BTreeMap<String, i64>, Signatures) {
        let entries = self.entries();
        let mut kinds: BTreeMap<String, i64> = BTreeMap::new();
        let mut signatures = Signatures::new();
        for sample in &self.samples {
            let has_java = sample.frames.iter().any(|f| Kind::of(f).is_java());
            let has_lost = sample.frames.iter().any(|f| Kind::of(f).is_lost());
            if !has_lost && (!has_java || Self::rooted(&entries, &sample.frames)) {
                continue;
            }
            let user: Vec<&String> = sample
                .frames
                .iter()
                .filter(|f| !matches!(Kind::of(f), Kind::Kernel | Kind::Truncated))
                .collect();
            let end = sample
                .frames
                .iter()
                .find(|f| Kind::of(f) == Kind::Truncated)
                .cloned()
                .unwrap_or_else(|| "(unmarked end)".to_owned());
            let java = sample
                .frames
                .iter()
                .filter(|f| Kind::of(f).is_java())
                .count();
            let leaf = user.first().map_or("(no user frame)".to_owned(), |f| {
                let pc = match (Kind::of(f), sample.leaf_line) {
                    (Kind::Jit | Kind::C1, Some(0)) => " (line 0: no debug info or bci at the pc)",
                    _ => "",
                };
                format!("{}{pc}", describe(f))
            });
            let outermost = user
                .last()
                .map_or("(no user frame)".to_owned(), |f| describe(f));
            let java_frames = match java {
                0 => "no Java frame",
                1 => "1 Java frame",
                _ => "2+ Java frames",
            };
            let kind = format!(
                "{end}; {java_frames}; {} user frame(s); leaf {leaf}; outermost {outermost}",
                if user.len() > 3 {
                    "4+".to_owned()
                } else {
                    user.len().to_string()
                },
            );
            *kinds.entry(kind).or_default() += sample.count;

            let kernel = if sample
                .frames
                .first()
                .is_some_and(|f| Kind::of(f) == Kind::Kernel)
            {
                "(kernel) "
            } else {
                ""
            };
            let inner: Vec<&str> = user.iter().take(3).map(|f| f.as_str()).collect();
            // The innermost three frames, and the last two the walk reached: the last one it
            // could name, and where it ended.
            let tail = match user.len() {
                0..=3 => String::new(),
                4 => format!(" <- {}", user[3]),
                5 => format!(" <- {} <- {}", user[3], user[4]),
                n => format!(
                    " <- ..{} more.. <- {} <- {}",
                    n - 5,
                    user[n - 2],
                    user[n - 1]
                ),
            };
            let signature = format!("{kernel}{}{tail} || {end}", inner.join(" <- "));
            let entry = signatures.entry(signature).or_default();
            entry.0 += sample.count;
            *entry.1.entry(thread_group(&sample.thread)).or_default() += sample.count;
        }
        (kinds, signatures)
    }

    fn report(&self) -> String {
        use std::fmt::Write as _;
        let mut r = String::new();
        let total = self.total();
        let lost = self.lost();
        let (with_java, rooted) = self.rooted_counts();
        let _ = writeln!(
            r,
            "===== {} on JDK {}: {} daemon samples in {} profiles ({:.1} s), {} JFR samples in that window ({} in the recording, jfr summary says {:?}); ready after {:.1} s",
            self.app,
            self.jdk,
            total,
            self.profiles,
            self.window_secs,
            self.jfr_total(),
            self.jfr_parsed,
            self.jfr_summary_count,
            self.ready_after.as_secs_f64()
        );
        let _ = writeln!(
            r,
            "(a) lost: {lost} of {total} samples ({:.2}%) have an unknown or truncated frame",
            pct(lost, total)
        );
        let jfr_truncated = self.jfr.iter().filter(|s| s.truncated).count();
        let _ = writeln!(
            r,
            "(b) rooted: {rooted} of {with_java} samples with Java frames ({:.2}%) start at a thread entry (JFR: {jfr_truncated} truncated stacks)",
            pct(rooted, with_java)
        );
        let mut roots: BTreeMap<String, i64> = BTreeMap::new();
        for sample in self.jfr.iter().filter(|s| !s.truncated) {
            if let Some((_, name)) = sample.frames.last() {
                *roots.entry(name.clone()).or_default() += 1;
            }
        }
        let _ = writeln!(r, "    JFR's roots: {}", top_counts(&roots, 8));

        let (ours, jfr) = self.leaf_distributions();
        let _ = writeln!(
            r,
            "(c) leaf methods{}: {} of our samples were in Java code (no native or kernel frame above the first Java frame), {} JFR samples",
            if self.jfr_marks_inlined() {
                " (inlined frames folded)"
            } else {
                " (innermost frames, not folded: this JFR marks no frame inlined)"
            },
            ours.total,
            jfr.total
        );
        let _ = writeln!(
            r,
            "    {:>8} {:>8} {:>8} {:>6}  method",
            "ours%", "jfr%", "diff pp", "σ pp"
        );
        for row in self.leaf_rows().iter().take(15) {
            let _ = writeln!(
                r,
                "    {:>8.2} {:>8.2} {:>+8.2} {:>6.2}  {}",
                row.ours * 100.0,
                row.jfr * 100.0,
                row.diff_pp(),
                row.sigma * 100.0,
                row.method
            );
        }

        let (kinds, signatures) = self.lost_stacks();
        let lost_total: i64 = kinds.values().sum();
        let _ = writeln!(
            r,
            "(d) lost stacks (unknown/truncated frame, or Java frames not rooted at an entry): {lost_total} samples ({:.2}%)",
            pct(lost_total, total)
        );
        let mut kinds: Vec<(String, i64)> = kinds.into_iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let _ = writeln!(r, "    by kind:");
        for (kind, n) in kinds.iter().take(15) {
            let _ = writeln!(r, "    {n:>6} {:>6.2}%  {kind}", pct(*n, total));
        }
        let mut signatures: Vec<_> = signatures.into_iter().collect();
        signatures.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
        let _ = writeln!(
            r,
            "    top signatures (innermost first <- ... outermost reached || end) [threads]:"
        );
        for (signature, (n, threads)) in signatures.iter().take(15) {
            let _ = writeln!(r, "    {n:>6}  {signature}  [{}]", top_counts(threads, 3));
        }
        let _ = writeln!(
            r,
            "    profiler_unwind_ends_total during JFR's window (whole run): {}",
            self.ends
                .iter()
                .map(|(reason, (window, all))| format!("{reason}={window} ({all})"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.alloc_report(&mut r);
        self.lock.report(&mut r);
        r
    }

    /// (e) Allocations: events and bytes per kind, sites, our stacks, the daemon's counters.
    fn alloc_report(&self, r: &mut String) {
        use std::fmt::Write as _;
        let _ = writeln!(
            r,
            "(e) allocations: {} alloc profiles ({:.1} s, interval {} bytes), {} JFR events in that window (read in the recording: {} in new TLABs, {} outside; jfr summary says {:?})",
            self.alloc_profiles,
            self.alloc_window_secs,
            self.alloc_interval,
            self.jfr_alloc.len(),
            self.jfr_alloc_parsed[0],
            self.jfr_alloc_parsed[1],
            self.jfr_alloc_summary
        );
        let _ = writeln!(
            r,
            "    {:<13} {:>10} {:>10} {:>7} {:>11} {:>11} {:>9} {:>7}",
            "kind", "JFR events", "ours (est)", "σ", "JFR MB", "ours MB", "ours/JFR", "σ"
        );
        // Printed, not asserted: our estimated events. Unbiased, but skewed where small
        // objects go outside TLABs: one 40-byte object sampled counts 13,107 events (Jetty on
        // JDK 27: 16,729 estimated outside TLABs, 4,118 in JFR, the same 57 MB).
        let kinds = self.alloc_kinds();
        let events = self.our_alloc_events();
        let mut all = AllocTally::default();
        for kind in AllocKind::ALL {
            let tally = &kinds[kind as usize];
            all.ours += tally.ours;
            all.jfr += tally.jfr;
            all.jfr_events += tally.jfr_events;
            all.variance += tally.variance;
            all.event_variance += tally.event_variance;
            Self::alloc_kind_row(r, kind.name(), tally, events[kind as usize]);
        }
        Self::alloc_kind_row(r, "all", &all, events.iter().sum());
        let _ = writeln!(
            r,
            "    sites (allocated class in innermost Java method), byte shares; * asserted (top {ASSERTED_SITES} of either side, at least {:.0}% of its bytes):",
            MIN_SITE_SHARE * 100.0
        );
        let _ = writeln!(
            r,
            "      {:>7} {:>7} {:>8} {:>6} {:>7}  site",
            "jfr%", "ours%", "diff pp", "σ pp", "allowed"
        );
        for row in self.site_rows() {
            let _ = writeln!(
                r,
                "    {} {:>7.2} {:>7.2} {:>+8.2} {:>6.2} {:>7.1}  {}",
                if row.asserted { '*' } else { ' ' },
                row.jfr * 100.0,
                row.ours * 100.0,
                row.diff_pp(),
                row.sigma * 100.0,
                row.allowed_pp(),
                row.site
            );
        }
        let entries = self.entries();
        let (mut bytes, mut rooted, mut lost, mut no_java) = (0, 0, 0, 0);
        for sample in &self.allocs {
            let b = sample.bytes();
            bytes += b;
            if sample.frames.iter().any(|f| Kind::of(f).is_lost()) {
                lost += b;
            }
            if !sample.frames.iter().skip(1).any(|f| Kind::of(f).is_java()) {
                no_java += b;
            } else if Self::rooted(&entries, &sample.frames[1..]) {
                rooted += b;
            }
        }
        let _ = writeln!(
            r,
            "    our allocation stacks, of {:.1} MB: {:.2}% rooted at a thread entry, {:.2}% with an unknown or truncated frame, {:.2}% without a Java frame",
            bytes as f64 / 1e6,
            pct(rooted, bytes),
            pct(lost, bytes),
            pct(no_java, bytes)
        );
        // What the hooks cost the application, as far as the CPU profile sees it: samples in
        // the kernel's uprobe traps (breakpoint, and single step where an instruction is run
        // out of line). The hook's BPF program itself may be invisible to the sampler.
        let in_hooks: i64 = self
            .samples
            .iter()
            .filter(|s| {
                s.frames
                    .iter()
                    .any(|f| f == "asm_exc_int3_[k]" || f == "asm_exc_debug_[k]")
            })
            .map(|s| s.count)
            .sum();
        let _ = writeln!(
            r,
            "    CPU samples in the uprobe traps of the allocation hooks: {in_hooks} of {} ({:.2}%)",
            self.total(),
            pct(in_hooks, self.total())
        );
        let _ = writeln!(
            r,
            "    daemon counters from just after JFR's start to its end (whole run): {}",
            self.alloc_counters
                .iter()
                .map(|(key, (window, all))| format!(
                    "{}={window} ({all})",
                    key.trim_start_matches("profiler_")
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    fn alloc_kind_row(r: &mut String, name: &str, tally: &AllocTally, our_events: i64) {
        use std::fmt::Write as _;
        let _ = writeln!(
            r,
            "    {:<13} {:>10} {:>10} {:>7.0} {:>11.1} {:>11.1} {:>9.4} {:>7.4}",
            name,
            tally.jfr_events,
            our_events,
            tally.event_variance.sqrt(),
            tally.jfr as f64 / 1e6,
            tally.ours as f64 / 1e6,
            tally.ours as f64 / tally.jfr.max(1) as f64,
            tally.variance.sqrt() / tally.jfr.max(1) as f64
        );
    }

    fn summary_line(&self) -> String {
        let total = self.total();
        let (with_java, rooted) = self.rooted_counts();
        let rows = self.leaf_rows();
        let worst = rows.first();
        format!(
            "{:8} JDK {:2}: samples ours {:5} / JFR {:5}; lost {:6.2}%; rooted {:6.2}%; worst leaf diff {} ",
            self.app,
            self.jdk,
            total,
            self.jfr_total(),
            pct(self.lost(), total),
            pct(rooted, with_java),
            worst.map_or("-".to_owned(), |row| format!(
                "{:+.1} pp (σ {:.1}) {}",
                row.diff_pp(),
                row.sigma * 100.0,
                row.method
            ))
        ) + &self.alloc_summary()
            + "\n                   lock waits: "
            + &self.lock.summary()
    }

    /// The summary line's allocation part: total bytes' ratio, the worst asserted site.
    fn alloc_summary(&self) -> String {
        let (_, total) = self.alloc_sites();
        let rows = self.site_rows();
        let worst = rows
            .iter()
            .filter(|row| row.asserted)
            .max_by(|a, b| a.diff_pp().abs().total_cmp(&b.diff_pp().abs()));
        format!(
            "\n                   alloc: bytes ours/JFR {:.3} ({:.0} / {:.0} MB); worst site diff {}",
            total.ours as f64 / total.jfr.max(1) as f64,
            total.ours as f64 / 1e6,
            total.jfr as f64 / 1e6,
            worst.map_or("-".to_owned(), |row| format!(
                "{:+.1} pp (σ {:.1}) {}",
                row.diff_pp(),
                row.sigma * 100.0,
                row.site
            ))
        )
    }

    fn harness_failures(&self) -> Vec<String> {
        let tag = format!("{} JDK {}", self.app, self.jdk);
        let mut failures = Vec::new();
        if !self.ran_through {
            failures.push(format!(
                "{tag}: the application stopped before the window ended"
            ));
        }
        if self.total() < MIN_SAMPLES {
            failures.push(format!("{tag}: only {} daemon samples", self.total()));
        }
        if self.jfr_total() < MIN_JFR_SAMPLES {
            failures.push(format!("{tag}: only {} JFR samples", self.jfr_total()));
        }
        if self.jfr_summary_count != Some(self.jfr_parsed as u64) {
            failures.push(format!(
                "{tag}: read {} JFR samples, jfr summary counts {:?}",
                self.jfr_parsed, self.jfr_summary_count
            ));
        }
        for (event, (parsed, summary)) in JFR_ALLOC_EVENTS
            .iter()
            .zip(self.jfr_alloc_parsed.iter().zip(self.jfr_alloc_summary))
        {
            if summary != Some(*parsed as u64) {
                failures.push(format!(
                    "{tag}: read {parsed} {event} events, jfr summary counts {summary:?}"
                ));
            }
        }
        if self.alloc_profiles == 0 {
            failures.push(format!("{tag}: no allocation profile inside JFR's window"));
        } else if self.allocs.is_empty() {
            failures.push(format!("{tag}: no allocation sample in the window"));
        }
        if self.jfr_alloc.is_empty() {
            failures.push(format!(
                "{tag}: JFR recorded no allocation event in the window"
            ));
        }
        failures.extend(self.lock.harness_failures(&tag));
        failures
    }

    fn target_failures(&self) -> Vec<String> {
        let tag = format!("{} JDK {}", self.app, self.jdk);
        let mut failures = Vec::new();
        let total = self.total();
        let lost = pct(self.lost(), total);
        if lost > 1.0 {
            failures.push(format!("{tag}: {lost:.2}% of samples lost (target <= 1%)"));
        }
        let (with_java, rooted) = self.rooted_counts();
        let rooted = pct(rooted, with_java);
        if rooted < 99.0 {
            // The ways the walks ended go with the failure: CI keeps only the end of the log.
            let (kinds, signatures) = self.lost_stacks();
            let mut kinds: Vec<(String, i64)> = kinds.into_iter().collect();
            kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut signatures: Vec<_> = signatures.into_iter().collect();
            signatures.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
            let mut message = format!("{tag}: {rooted:.2}% rooted (target >= 99%); lost by kind:");
            for (kind, n) in kinds.iter().take(5) {
                message += &format!("\n      {n:>5}  {kind}");
            }
            message += "\n    top signatures:";
            for (signature, (n, threads)) in signatures.iter().take(5) {
                message += &format!("\n      {n:>5}  {signature}  [{}]", top_counts(threads, 2));
            }
            failures.push(message);
        }
        for row in self.leaf_rows() {
            let allowed = 3.0 * row.sigma * 100.0 + 10.0;
            if row.diff_pp().abs() > allowed {
                failures.push(format!(
                    "{tag}: leaf {} {:.1}% vs JFR {:.1}% ({:+.1} pp, allowed {allowed:.1})",
                    row.method,
                    row.ours * 100.0,
                    row.jfr * 100.0,
                    row.diff_pp()
                ));
            }
        }
        failures.extend(self.alloc_target_failures());
        failures.extend(self.lock.target_failures(&tag));
        failures
    }

    /// Allocation sites and total bytes against JFR's. Both profilers see the same events
    /// (JFR every one, we a sample), so the standard errors are our sampling's alone (see
    /// [`Self::site_rows`]); 3 of them, plus a margin for what sampling does not explain:
    /// events near the window's ends (a TLAB of up to megabytes counts whole in one interval
    /// or the next, and each side stamps it with its own clock), and allocations whose
    /// innermost Java frame one side names and the other cannot. 3 pp for sites (a share of
    /// the same events, not two samplings of CPU time with their own biases as for leaf
    /// methods, hence far less than their 10 pp); 2% for the total (both sides' clocks agree
    /// within milliseconds over a window of 15 s).
    fn alloc_target_failures(&self) -> Vec<String> {
        let tag = format!("{} JDK {}", self.app, self.jdk);
        let mut failures = Vec::new();
        for row in self.site_rows().iter().filter(|row| row.asserted) {
            if row.diff_pp().abs() > row.allowed_pp() {
                failures.push(format!(
                    "{tag}: allocation site {}: {:.1}% of our bytes vs JFR {:.1}% ({:+.1} pp, allowed {:.1})",
                    row.site,
                    row.ours * 100.0,
                    row.jfr * 100.0,
                    row.diff_pp(),
                    row.allowed_pp()
                ));
            }
        }
        let (_, total) = self.alloc_sites();
        let ratio = total.ours as f64 / total.jfr.max(1) as f64;
        let allowed = 3.0 * total.variance.sqrt() / total.jfr.max(1) as f64 + 0.02;
        if (ratio - 1.0).abs() > allowed {
            failures.push(format!(
                "{tag}: {:.1} MB allocated by our profiles, {:.1} MB by JFR's events (ratio {ratio:.3}, allowed 1 ± {allowed:.3})",
                total.ours as f64 / 1e6,
                total.jfr as f64 / 1e6,
            ));
        }
        failures
    }
}

/// A thread name without its numbers (`jetty-worker-23` -> `jetty-worker-#`).
fn thread_group(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn pct(part: i64, whole: i64) -> f64 {
    part as f64 * 100.0 / whole.max(1) as f64
}

fn top_counts(counts: &BTreeMap<String, i64>, n: usize) -> String {
    let mut entries: Vec<(&String, &i64)> = counts.iter().collect();
    entries.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    entries
        .into_iter()
        .take(n)
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn names_and_kinds_parse() {
    assert_eq!(
        normalize("java.lang.invoke.LambdaForm$MH/0x0000000800c0c000.invoke"),
        "java.lang.invoke.LambdaForm$MH.invoke"
    );
    assert_eq!(
        normalize("java.lang.String$$StringConcat.0x0000000077108000.concat"),
        "java.lang.String$$StringConcat.concat"
    );
    assert_eq!(normalize("a.B.c"), "a.B.c");
    assert_eq!(
        normalize("java.util.stream.FindOps$FindSink$OfInt$$Lambda$34+0x800000045.712256162.get"),
        "java.util.stream.FindOps$FindSink$OfInt$$Lambda$34.get"
    );
    assert_eq!(normalize("main"), "main");
    assert_eq!(
        normalize_class("x.Foo$$Lambda/0x0000000800c03000"),
        "x.Foo$$Lambda"
    );
    assert_eq!(
        normalize_class("x.Foo$$Lambda+0x0000000800c03000[][]"),
        "x.Foo$$Lambda[][]"
    );
    assert_eq!(normalize_class("java.lang.Object[]"), "java.lang.Object[]");
    let alloc: Vec<String> = ["byte[]", "[_new_array_Java]", "x.Y.copy_[i]", "x.Y.run_[j]"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(Measurement::our_site(&alloc), "byte[] in x.Y.copy");
    assert_eq!(
        Measurement::our_site(&alloc[..2]),
        format!("byte[] in {NO_JAVA_FRAME}")
    );
    assert_eq!(Kind::of("a.B.c_[j]"), Kind::Jit);
    assert_eq!(Kind::of("[vtable chunks]"), Kind::Stub);
    assert_eq!(Kind::of("[truncated: java_read_failed]"), Kind::Truncated);
    assert_eq!(Kind::of("[unknown java method]_[j]"), Kind::UnknownJava);
    assert_eq!(Kind::of("[unknown]"), Kind::Unknown);
    assert_eq!(
        Kind::of("[unknown] (outside the code cache)"),
        Kind::Unknown
    );
    assert_eq!(Kind::of("do_syscall_64_[k]"), Kind::Kernel);
    assert_eq!(Kind::of("JavaCalls::call_helper"), Kind::Native);
    assert_eq!(base_name("a.B.c_[i]"), "a.B.c");
    let frames: Vec<String> = [
        "x.Y.leaf_[i]",
        "x.Y.mid_[i]",
        "x.Y.outer_[j]",
        "java.lang.Thread.run_[j]",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(Measurement::our_leaf(&frames, true), "x.Y.outer");
    assert_eq!(Measurement::our_leaf(&frames, false), "x.Y.leaf");
    assert!(Measurement::in_java(&frames));
    let entries: HashSet<String> = ["java.lang.Thread.run".to_owned()].into_iter().collect();
    assert!(Measurement::rooted(&entries, &frames));
}
