//! What a worker node reads of the host, to set it up and to check it cleaned up after itself:
//! `ip` commands, sysctls, the cgroup hierarchies, mounts, processes and the host's iptables
//! rules.
//!
//! Not the node's own processes or namespace (the parent module) and not the teardown
//! (`teardown`).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;
use crate::docker::run;

pub(super) fn ip(args: &[&str]) -> Result<(), Error> {
    run(Command::new("ip").args(args))
}

pub(super) fn read_sysctl(name: &str) -> Result<String, Error> {
    let path = Path::new("/proc/sys").join(name);
    std::fs::read_to_string(&path)
        .map(|v| v.trim().to_owned())
        .map_err(|e| Error::io(format!("read {}", path.display()), e))
}

/// The mount points of the cgroup v1 hierarchies, or the cgroup v2 root.
pub(super) fn cgroup_hierarchies() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|line| {
            let (fields, rest) = line.split_once(" - ")?;
            let fstype = rest.split_whitespace().next()?;
            let point = fields.split_whitespace().nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(point))
        })
        .collect()
}

/// Mount points at or under `dir`, deepest first.
pub(super) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split_whitespace().nth(4).map(PathBuf::from))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

/// Every directory of a cgroup subtree, deepest first.
pub(super) fn subtree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
        out.push(dir);
    }
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out
}

/// Processes whose command line mentions `needle`.
pub(super) fn processes_mentioning(needle: &str) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id() as i32;
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me)
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let line = String::from_utf8_lossy(&raw).replace('\0', " ");
            line.contains(needle).then_some((pid, line))
        })
        .collect()
}

/// The host's IPv4 and IPv6 rules and chains in every table (`iptables -t T -S`), one line each
/// prefixed with the command and table; a table the kernel lacks reads as empty. The kubelet's,
/// kube-proxy's and the bridge plugin's rules belong in the node's namespace, never here.
pub(super) fn host_iptables_rules() -> Vec<String> {
    let mut rules = Vec::new();
    for command in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle", "raw"] {
            let Ok(out) = Command::new(command)
                .args(["-w", "-t", table, "-S"])
                .output()
            else {
                continue;
            };
            if out.status.success() {
                rules.extend(
                    String::from_utf8_lossy(&out.stdout)
                        .lines()
                        .map(|line| format!("{command} -t {table} {line}")),
                );
            }
        }
    }
    rules
}
