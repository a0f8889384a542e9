//! The standard `process_*` metrics of the Prometheus client libraries
//! (<https://prometheus.io/docs/instrumenting/writing_clientlibs/#process-metrics>), read from
//! `/proc/self` at each scrape, and `flotilla_build_info`. On hosts without `/proc` (Windows,
//! macOS) only the build info is served.

use prometheus::{Counter, Gauge, IntGauge, IntGaugeVec, Opts, Registry};

use crate::metrics::MetricsError;

/// The process's own figures, refreshed by [`ProcessMetrics::refresh`] before each render.
/// The families exist on every platform; only Linux fills them (from `/proc`).
#[derive(Clone)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub struct ProcessMetrics {
    cpu_seconds: Counter,
    resident_bytes: IntGauge,
    virtual_bytes: IntGauge,
    open_fds: IntGauge,
    max_fds: IntGauge,
    threads: IntGauge,
    start_time: Gauge,
}

fn register<M: prometheus::core::Collector + Clone + 'static>(
    r: &Registry,
    m: M,
) -> Result<M, MetricsError> {
    r.register(Box::new(m.clone()))?;
    Ok(m)
}

impl ProcessMetrics {
    /// Registers the families, and the build info with its one series set to 1.
    pub fn new(r: &Registry) -> Result<ProcessMetrics, MetricsError> {
        let info = register(
            r,
            IntGaugeVec::new(
                Opts::new(
                    "flotilla_build_info",
                    "Always 1; the labels say which build runs.",
                ),
                &["version", "wit", "os", "arch"],
            )?,
        )?;
        info.with_label_values(&[
            env!("CARGO_PKG_VERSION"),
            flotilla_plugin_runtime::CONTRACT_VERSION,
            std::env::consts::OS,
            std::env::consts::ARCH,
        ])
        .set(1);
        Ok(ProcessMetrics {
            cpu_seconds: register(
                r,
                Counter::new(
                    "process_cpu_seconds_total",
                    "Total user and system CPU time spent in seconds.",
                )?,
            )?,
            resident_bytes: register(
                r,
                IntGauge::new(
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes.",
                )?,
            )?,
            virtual_bytes: register(
                r,
                IntGauge::new(
                    "process_virtual_memory_bytes",
                    "Virtual memory size in bytes.",
                )?,
            )?,
            open_fds: register(
                r,
                IntGauge::new("process_open_fds", "Number of open file descriptors.")?,
            )?,
            max_fds: register(
                r,
                IntGauge::new(
                    "process_max_fds",
                    "Maximum number of open file descriptors.",
                )?,
            )?,
            threads: register(
                r,
                IntGauge::new("process_threads", "Number of OS threads in the process.")?,
            )?,
            start_time: register(
                r,
                Gauge::new(
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                )?,
            )?,
        })
    }

    /// Reads the figures now. A file that cannot be read leaves its figures as they were.
    pub fn refresh(&self) {
        #[cfg(target_os = "linux")]
        self.refresh_linux();
    }

    #[cfg(target_os = "linux")]
    fn refresh_linux(&self) {
        // USER_HZ, the unit of proc(5)'s times: 100 on every architecture this host ships for
        // (the kernel's ABI constant; `getconf CLK_TCK`).
        let ticks = 100.0_f64;
        if let Some(stat) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| Stat::parse(&s))
        {
            let cpu = (stat.utime + stat.stime) as f64 / ticks;
            let more = cpu - self.cpu_seconds.get();
            if more > 0.0 {
                self.cpu_seconds.inc_by(more);
            }
            if let Some(boot) = boot_time() {
                self.start_time
                    .set(boot as f64 + stat.start_ticks as f64 / ticks);
            }
            self.threads.set(stat.threads);
            self.virtual_bytes.set(stat.vsize);
        }
        if let Some(kib) = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| status_kib(&s, "VmRSS:"))
        {
            self.resident_bytes.set(kib.saturating_mul(1024));
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(fds.count() as i64);
        }
        if let Some(limit) = rustix::process::getrlimit(rustix::process::Resource::Nofile).current {
            self.max_fds.set(i64::try_from(limit).unwrap_or(i64::MAX));
        }
    }
}

/// The fields of `/proc/self/stat` read here (proc(5)).
#[cfg(any(target_os = "linux", test))]
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    utime: u64,
    stime: u64,
    threads: i64,
    start_ticks: u64,
    vsize: i64,
}

#[cfg(any(target_os = "linux", test))]
impl Stat {
    /// Fields after the command name, which is in parentheses and may hold spaces or `)`.
    fn parse(text: &str) -> Option<Stat> {
        let (_, rest) = text.rsplit_once(')')?;
        // `rest` starts at field 3 (state): field n is at index n - 3.
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            utime: num(14)?,
            stime: num(15)?,
            threads: i64::try_from(num(20)?).ok()?,
            start_ticks: num(22)?,
            vsize: i64::try_from(num(23)?).ok()?,
        })
    }
}

/// A `Key:   N kB` line of `/proc/self/status`.
#[cfg(any(target_os = "linux", test))]
fn status_kib(text: &str, key: &str) -> Option<i64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line.strip_prefix(key)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The boot time in seconds since the epoch (`btime` of `/proc/stat`).
#[cfg(target_os = "linux")]
fn boot_time() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command name with spaces and a parenthesis does not shift the fields.
    #[test]
    fn stat_fields_are_read_after_the_command_name() {
        let line = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 75 0 0 20 0 7 0 12345 104857600 2560 18446744073709551615";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                utime: 250,
                stime: 75,
                threads: 7,
                start_ticks: 12345,
                vsize: 104_857_600,
            })
        );
        assert_eq!(
            status_kib("Name:\tflotilla\nVmRSS:\t   20480 kB\n", "VmRSS:"),
            Some(20480)
        );
    }
}
