//! `profiler-daemon`: command-line entry point.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use profiler_daemon::config::{Config, Environment, FileConfig, Overrides};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    version,
    about = "Continuous CPU profiler for JVMs and native processes (eBPF)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Sample every CPU and write one pprof profile per process per interval.
    Run(RunArgs),
    /// Show what the daemon reads from a running JVM: version, VMStructs layout, code heaps.
    JvmInfo {
        pid: u32,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Build the native unwind table of ELF files as the daemon would: rows, memory in the BPF
    /// maps, build time, and what it could not express.
    UnwindInfo {
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Receive profiles live from a running daemon's stream (its --grpc-listen address).
    Subscribe(SubscribeArgs),
    /// Merge the stored profiles of a time window into one flame graph (interactive SVG), of a
    /// service, a process or the whole host; with --before-from, a differential flame graph
    /// of what changed since an earlier window.
    View(ViewArgs),
    /// Show what this node's kernel lets the daemon do: BPF features, the object and path each
    /// program takes, BTF, privileges and limits, and what will not work and why. Exits 1 if a
    /// program is refused.
    Check {
        /// Print each refused program's whole verifier log.
        #[arg(long)]
        verifier_logs: bool,
    },
    /// Load the JVMTI sidecar agent into a running JVM (HotSpot dynamic attach).
    Attach {
        pid: u32,
        /// The agent library [default: libprofiler_jvmti.so beside this executable].
        #[arg(long, value_name = "PATH")]
        agent: Option<PathBuf>,
        /// Options passed to the agent, e.g. max_bytes=33554432.
        #[arg(long, value_name = "OPTIONS", default_value = "")]
        options: String,
    },
}

#[derive(clap::Args)]
struct SubscribeArgs {
    /// The daemon's stream address [default: 127.0.0.1:4980].
    #[arg(default_value = profiler_daemon::config::DEFAULT_GRPC_LISTEN)]
    address: String,
    /// Only this process (host pid); repeat for several.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Only this service; repeat for several.
    #[arg(long = "service", value_name = "NAME")]
    services: Vec<String>,
    /// Write each profile as a pprof file in DIR.
    #[arg(long, value_name = "DIR", conflicts_with = "top")]
    output: Option<PathBuf>,
    /// Print each profile's N functions with the most self samples [default: 10].
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// Exit after this many profiles.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
}

#[derive(clap::Args)]
struct ViewArgs {
    /// The directory `run` writes to (its --output).
    #[arg(long, value_name = "DIR", default_value = profiler_daemon::config::DEFAULT_OUTPUT_DIR)]
    dir: PathBuf,
    /// Profiles that started at or after TIME: UTC (2026-11-26T10:00:00Z) or a duration ago
    /// (10m, 1h30m) [default: the oldest].
    #[arg(long, value_name = "TIME")]
    from: Option<String>,
    /// ... and before TIME (same forms) [default: now].
    #[arg(long, value_name = "TIME")]
    to: Option<String>,
    /// Only this service (its service_name); repeat for several.
    #[arg(long = "service", value_name = "NAME")]
    services: Vec<String>,
    /// Only processes of this name (`comm`, as in the file names); repeat for several.
    #[arg(long = "process", value_name = "NAME")]
    processes: Vec<String>,
    /// Only this process (host pid); repeat for several.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Which profiles: where threads run (cpu), wait (offcpu), allocate (alloc), wait for
    /// monitors (mutex) or are parked (block).
    #[arg(
        long,
        value_name = "cpu|offcpu|alloc|mutex|block",
        default_value = "cpu"
    )]
    kind: String,
    /// Stacks of all threads merged, rooted at their thread pool, or at their thread.
    #[arg(long, value_name = "merged|pool|thread", default_value = "merged")]
    threads: String,
    /// Draw what changed since this earlier window (same forms as --from): a differential
    /// flame graph, red where the viewed window spends more, blue less (the earlier window
    /// scaled to the same total).
    #[arg(long, value_name = "TIME")]
    before_from: Option<String>,
    /// End of the earlier window [default: --from].
    #[arg(long, value_name = "TIME")]
    before_to: Option<String>,
    /// The SVG to write.
    #[arg(short, long, value_name = "FILE", default_value = "view.svg")]
    output: PathBuf,
}

#[derive(clap::Args)]
struct RunArgs {
    /// TOML configuration file; flags override its values.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Profile only this process (host pid); repeat for several. Default: every process.
    #[arg(long = "pid", value_name = "PID")]
    pids: Vec<u32>,
    /// Samples per second per CPU (1 to 1000) [default: 19].
    #[arg(long, value_name = "HZ")]
    frequency: Option<u64>,
    /// Seconds covered by each profile [default: 15].
    #[arg(long, value_name = "SECS")]
    interval: Option<u64>,
    /// Stop after this many seconds [default: run until SIGINT/SIGTERM].
    #[arg(long, value_name = "SECS")]
    duration: Option<u64>,
    /// Directory for the pprof files [default: ./profiles].
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
    /// Permission bits of the profile files, octal; the directory, if created, gets search
    /// where read is granted [default: 0600, in a 0700 directory].
    #[arg(long, value_name = "MODE")]
    output_mode: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9464 [default: off].
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Export profiles to Grafana Pyroscope at URL (http:// or https://); the config file's
    /// [pyroscope] table sets auth, tenant, TLS and queue bounds.
    #[arg(long, value_name = "URL")]
    pyroscope: Option<String>,
    /// Export OTLP profiles over gRPC to this collector or backend, e.g. http://otel-collector:4317;
    /// the [otlp] table sets auth, tenant, TLS and queue bounds.
    #[arg(long, value_name = "URL")]
    otlp: Option<String>,
    /// Serve the live profile stream (gRPC, unauthenticated) at ADDR, e.g. 127.0.0.1:4980, or
    /// "off" [default: off].
    #[arg(long, value_name = "ADDR")]
    grpc_listen: Option<String>,
    /// Load the JVMTI sidecar agent into the JVMs found ("auto") or not ("never") [default:
    /// never]; the config file's attach_allow / attach_deny narrow "auto".
    #[arg(long, value_name = "auto|never")]
    attach: Option<String>,
    /// Off-CPU profiles too (`offcpu-*` files, Pyroscope's `off_cpu`): where threads wait and
    /// for how long; the config file's off_cpu_period_us / off_cpu_min_wait_us tune it.
    #[arg(long)]
    off_cpu: bool,
    /// Java allocation profiles too (`alloc-*` files, Pyroscope's `memory`): where Java
    /// threads allocate and how much, about one sample per BYTES allocated [default: 512k].
    #[arg(long, value_name = "BYTES", num_args = 0..=1, require_equals = true,
          value_parser = profiler_daemon::commands::parse_bytes)]
    alloc: Option<Option<u64>>,
    /// Java lock profiles too (`mutex-*` and `block-*` files, Pyroscope's `mutex` and
    /// `block`): where Java threads wait to enter monitors and are parked, leaving out waits
    /// shorter than DURATION [default: 10ms]. Samples waits as --off-cpu does.
    #[arg(long, value_name = "DURATION", num_args = 0..=1, require_equals = true,
          value_parser = profiler_daemon::commands::parse_duration)]
    lock: Option<Option<std::time::Duration>>,
    /// How Pyroscope's profiles and the local flame graphs show threads: "merged" (no thread
    /// frame), "pool" (a root per thread pool) or "thread" (a root per thread) [default:
    /// merged].
    #[arg(long, value_name = "merged|pool|thread")]
    threads: Option<String>,
}

fn main() -> ExitCode {
    profiler_daemon::own_memory::settle_allocator();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: journald and log files get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args),
        Command::JvmInfo { pid, json } => jvm_info(pid, json),
        Command::UnwindInfo { files } => unwind_info(&files),
        Command::Subscribe(args) => subscribe(args),
        Command::View(args) => view(args),
        Command::Check { verifier_logs } => check(verifier_logs),
        Command::Attach {
            pid,
            agent,
            options,
        } => attach(pid, agent, &options),
    }
}

fn check(verifier_logs: bool) -> ExitCode {
    let report = profiler_daemon::commands::check_kernel(verifier_logs);
    print!("{}", report.text);
    if report.all_loaded {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run(args: RunArgs) -> ExitCode {
    profiler_daemon::own_memory::read_own_binary_as_run();
    let file = match args.config.as_deref().map(FileConfig::load).transpose() {
        Ok(file) => file.unwrap_or_default(),
        Err(err) => return usage_error(&err),
    };
    let overrides = Overrides {
        frequency: args.frequency,
        interval_secs: args.interval,
        duration_secs: args.duration,
        output_dir: args.output,
        output_mode: args.output_mode,
        pids: args.pids,
        metrics_listen: args.metrics_listen,
        pyroscope_url: args.pyroscope,
        otlp_url: args.otlp,
        grpc_listen: args.grpc_listen,
        attach: args.attach,
        off_cpu: args.off_cpu,
        alloc: args.alloc,
        lock: args.lock,
        threads: args.threads,
    };
    let config = match Config::resolve(file, overrides, &Environment::of_this_process()) {
        Ok(config) => config,
        Err(err) => return usage_error(&err),
    };
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(profiler_daemon::commands::run(config)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(err.exit_code() as u8)
        }
    }
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime),
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            None
        }
    }
}

fn subscribe(args: SubscribeArgs) -> ExitCode {
    use profiler_daemon::subscribe::{Sink, Subscription};
    let sink = match args.output {
        Some(dir) => Sink::Directory(dir),
        None => Sink::Top(args.top.unwrap_or(10)),
    };
    let subscription = Subscription {
        address: args.address,
        pids: args.pids,
        services: args.services,
        sink,
        count: args.count,
    };
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(profiler_daemon::subscribe::run(subscription)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn view(args: ViewArgs) -> ExitCode {
    use profiler_daemon::output::view;
    let options = view::ViewOptions {
        dir: args.dir,
        from: args.from,
        to: args.to,
        services: args.services,
        processes: args.processes,
        pids: args.pids,
        kind: args.kind,
        threads: args.threads,
        before_from: args.before_from,
        before_to: args.before_to,
        output: args.output,
    };
    let result = view::ViewRequest::resolve(options, std::time::SystemTime::now())
        .and_then(|request| view::run(&request));
    match result {
        Ok(summary) => {
            eprintln!("{summary}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

fn jvm_info(pid: u32, json: bool) -> ExitCode {
    match profiler_daemon::commands::inspect_jvm(pid) {
        Ok(report) => {
            if json {
                match serde_json::to_string_pretty(&report) {
                    Ok(text) => println!("{text}"),
                    Err(err) => {
                        eprintln!("error: {err}");
                        return ExitCode::FAILURE;
                    }
                }
            } else {
                print!("{}", profiler_daemon::commands::render_jvm_info(&report));
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn unwind_info(files: &[PathBuf]) -> ExitCode {
    let mut failed = false;
    for path in files {
        match profiler_daemon::commands::describe_unwind_tables(path) {
            Ok(report) => println!("{}: {report}", path.display()),
            Err(err) => {
                eprintln!("{}: {err}", path.display());
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn attach(pid: u32, agent: Option<PathBuf>, options: &str) -> ExitCode {
    let agent = match agent {
        Some(agent) => agent,
        None => match std::env::current_exe() {
            Ok(exe) => exe.with_file_name("libprofiler_jvmti.so"),
            Err(err) => {
                eprintln!("error: cannot locate the agent beside this executable: {err}");
                return ExitCode::FAILURE;
            }
        },
    };
    match profiler_daemon::commands::attach_agent(pid, &agent, options) {
        Ok(attached) => {
            println!(
                "attached to JVM {pid} in {} ms{}: agent {}; records at {}",
                attached.elapsed.as_millis(),
                if attached.started_listener {
                    " (attach listener started)"
                } else {
                    ""
                },
                attached.agent_path.display(),
                attached.records.display()
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: attaching to JVM {pid}: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn usage_error(err: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {err}");
    ExitCode::from(2)
}
