//! What every tollgate server exports about itself, beside its own metrics: the
//! build (`tollgate_build_info`) and the process, under the names Prometheus's
//! client libraries use (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_open_fds`, ...), read from `/proc/self` at each scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The commit the binary was built from, as it says at start ([`set_commit`]).
static COMMIT: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Names the commit the binary was built from, for `tollgate_build_info`. The binary
/// reads it in its own build script and says it here at start, so that a new commit
/// rebuilds the binary alone, not every crate under it.
pub fn set_commit(commit: &'static str) {
    let _ = COMMIT.set(commit);
}

/// The commit [`set_commit`] named, or `unknown`.
pub fn commit() -> &'static str {
    COMMIT.get().copied().unwrap_or("unknown")
}

/// Registers `tollgate_build_info` and the process collector on `root`, which must
/// have no prefix; returns a registry under `prefix` for the server's own metrics.
pub fn register<'r>(root: &'r mut Registry, prefix: &str) -> &'r mut Registry {
    root.register(
        "tollgate_build",
        "The running build: its version and commit",
        Info::new([("version", env!("CARGO_PKG_VERSION")), ("commit", commit())]),
    );
    root.register_collector(Box::new(ProcessCollector));
    root.sub_registry_with_prefix(prefix)
}

/// The process's figures, read at each scrape (Linux; elsewhere it writes nothing).
#[derive(Debug)]
struct ProcessCollector;

/// What `/proc/self` says.
struct ProcessFigures {
    cpu_seconds: f64,
    resident_bytes: i64,
    virtual_bytes: i64,
    threads: i64,
    start_time_seconds: f64,
    open_fds: i64,
    max_fds: i64,
}

impl ProcessFigures {
    fn read() -> Option<ProcessFigures> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command (which may hold spaces and parentheses).
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // Numbered as in proc(5), from state (3): utime 14, stime 15, starttime 22.
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        // /proc counts time in USER_HZ ticks, 100 a second on every Linux ABI.
        let ticks = 100.0;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let status_field = |name: &str| {
            status.lines().find_map(|l| {
                l.strip_prefix(name)?
                    .split_whitespace()
                    .next()?
                    .parse::<i64>()
                    .ok()
            })
        };
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as i64;
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()?
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3)?.parse::<i64>().ok())
            .unwrap_or(-1);
        Some(ProcessFigures {
            cpu_seconds: (field(14)? + field(15)?) as f64 / ticks,
            resident_bytes: status_field("VmRSS:")? * 1024,
            virtual_bytes: status_field("VmSize:")? * 1024,
            threads: status_field("Threads:")?,
            start_time_seconds: boot as f64 + field(22)? as f64 / ticks,
            open_fds,
            max_fds,
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(p) = ProcessFigures::read() else {
            return Ok(());
        };
        let counter = ConstCounter::new(p.cpu_seconds);
        counter.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds",
            None,
            MetricType::Counter,
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory, bytes",
                p.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory, bytes",
                p.virtual_bytes,
            ),
            ("process_threads", "Threads of the process", p.threads),
            ("process_open_fds", "Open file descriptors", p.open_fds),
            (
                "process_max_fds",
                "The limit on open file descriptors",
                p.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value as f64);
            gauge.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        let start = ConstGauge::new(p.start_time_seconds);
        start.encode(encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch, in seconds",
            None,
            MetricType::Gauge,
        )?)?;
        Ok(())
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_and_the_process_are_exported() {
        // Some CPU time first, so that the process's reaches a tick (10 ms).
        let mut x = 1u64;
        while ProcessFigures::read().unwrap().cpu_seconds == 0.0 {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
        }
        let mut root = Registry::default();
        let own = register(&mut root, "tollgate_proxy");
        own.register(
            "x",
            "a metric of the server's own",
            prometheus_client::metrics::counter::Counter::<u64>::default(),
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &root).unwrap();
        assert!(
            text.contains(&format!(
                "tollgate_build_info{{version=\"{}\",commit=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION"),
                commit()
            )),
            "{text}"
        );
        assert!(text.contains("tollgate_proxy_x_total 0"), "{text}");
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} in {text}"))
                .parse()
                .unwrap()
        };
        assert!(value("process_cpu_seconds_total") > 0.0);
        // A test binary holds more than a megabyte and a few threads and files.
        assert!(value("process_resident_memory_bytes") > 1e6);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_threads") >= 1.0);
        assert!(value("process_open_fds") >= 3.0);
        assert!(value("process_max_fds") >= value("process_open_fds"));
        let now = std::time::SystemTime::UNIX_EPOCH
            .elapsed()
            .unwrap()
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0,
            "{start} against {now}"
        );
    }
}
