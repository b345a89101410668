//! CPU time and resident memory of a process, from `/proc/<pid>/stat` and `/proc/<pid>/status`.

/// One reading.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// User plus system CPU time since the process started, seconds.
    pub cpu_seconds: f64,
    /// Peak resident set size (`VmHWM`), MiB.
    pub peak_rss_mib: f64,
    /// Current resident set size (`VmRSS`), MiB.
    pub rss_mib: f64,
}

impl Usage {
    /// Reads the process's usage now. Panics if the process is gone.
    pub fn read(pid: u32) -> Usage {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // Fields after the command name, which is in parentheses and may hold spaces: state is
        // field 3, utime field 14, stime field 15.
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        Usage {
            cpu_seconds: ticks as f64 / clock_ticks(),
            peak_rss_mib: kib(&status, "VmHWM:") / 1024.0,
            rss_mib: kib(&status, "VmRSS:") / 1024.0,
        }
    }
}

/// `getconf CLK_TCK`, 100 if it cannot be asked.
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

fn kib(status: &str, key: &str) -> f64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/<pid>/status"))
}
