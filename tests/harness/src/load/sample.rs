//! What a process holds now, read from `/proc` (Linux): resident memory, its peak, threads,
//! open descriptors and sockets, CPU time.

use std::time::Duration;

/// One reading of one process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reading {
    pub rss: u64,
    pub peak_rss: u64,
    pub threads: u64,
    pub fds: u64,
    pub sockets: u64,
    pub cpu: Duration,
}

/// Reads process `pid`; `None` once it is gone.
pub fn read(pid: u32) -> Option<Reading> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let (mut fds, mut sockets) = (0, 0);
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for entry in dir.flatten() {
            fds += 1;
            if std::fs::read_link(entry.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
            {
                sockets += 1;
            }
        }
    }
    Some(Reading {
        rss: field("VmRSS:") * 1024,
        peak_rss: field("VmHWM:") * 1024,
        threads: field("Threads:"),
        fds,
        sockets,
        cpu: cpu(pid).unwrap_or_default(),
    })
}

/// The peak RSS (`VmHWM`) and thread count of `pid`: one small read.
pub fn peak(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    Some((field("VmHWM:")? * 1024, field("Threads:")?))
}

/// The proportional set size of `pid`: its private pages, and its share of the pages it
/// shares (a thousand drivers map one binary: each counts a thousandth of it).
pub fn pss(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kib: u64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The CPU time of `root` and every process under it, living or reaped: each one's user and
/// system time, and its reaped children's (`cutime`, `cstime`), so a process that came and went
/// is counted once, in the parent that waited for it.
pub fn tree_cpu(root: u32) -> Duration {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(ppid) = stat_field(pid, 1) {
                parent_of.push((pid, ppid as u32));
            }
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while let Some(&p) = tree.get(i) {
        tree.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree.into_iter()
        .map(|pid| {
            let ticks: u64 = (11..=14).filter_map(|f| stat_field(pid, f)).sum();
            Duration::from_millis(ticks * 10)
        })
        .sum()
}

/// Field `index` (0-based, counted after the command name: 0 is the state, 1 the parent) of
/// `/proc/<pid>/stat`.
fn stat_field(pid: u32, index: usize) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(index)?
        .parse()
        .ok()
}

/// User plus system CPU time of `pid`, from `/proc/<pid>/stat` (clock ticks of 1/100 s, as
/// Linux reports them to user space on every architecture it runs us on).
fn cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields count from the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime 14 and stime 15 (1-based, man proc).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_as_alive_with_memory_threads_and_descriptors() {
        let me = read(std::process::id()).expect("this process");
        assert!(me.rss > 1 << 20 && me.peak_rss >= me.rss, "{me:?}");
        assert!(me.threads >= 1 && me.fds >= 3, "{me:?}");
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(300) {
            std::hint::black_box(0u64);
        }
        assert!(read(std::process::id()).expect("again").cpu >= Duration::from_millis(100));
        assert_eq!(read(u32::MAX), None);
        let pss = pss(std::process::id()).expect("pss");
        assert!(pss > 0 && pss <= me.peak_rss * 2, "{pss}");
    }
}
