//! What the workload uses, sampled every heartbeat interval and sent to the node
//! (`POST /v1/stats`) for the kubelet API's `/stats/summary` and `/metrics/resource`: CPU time
//! and resident memory of the workload's process tree (the process executor: its child and
//! every descendant, from `/proc`), and the GPUs `nvidia-smi` reports. With the docker executor
//! the container's processes are not the runner's descendants, so CPU and memory are absent
//! (never zero) and only the GPUs are reported.
//!
//! Best effort: a failed send is logged, and a node that answers 404 (it predates the route)
//! is not asked again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use neocloud_protocol::{GpuStats, WorkloadStats};

use crate::client::CallbackClient;

/// `/proc/<pid>/stat` counts CPU time in clock ticks of `USER_HZ`, which Linux fixes at 100
/// for user space whatever the kernel's own tick.
const USER_HZ: u64 = 100;

/// The process tree rooted at `root`: its pid and every descendant's, each with the CPU ticks
/// (user and system) it used, from one pass over `/proc`.
fn tree(root: u32) -> Vec<(u32, u64)> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    let mut ticks: HashMap<u32, u64> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Some(f) = stat_fields(pid) else {
            continue;
        };
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        if let Some(ppid) = n(1) {
            children.entry(ppid as u32).or_default().push(pid);
        }
        ticks.insert(pid, n(11).unwrap_or(0) + n(12).unwrap_or(0));
    }
    if !ticks.contains_key(&root) {
        return Vec::new();
    }
    let mut out = vec![root];
    let mut at = 0;
    while at < out.len() {
        if let Some(kids) = children.get(&out[at]) {
            out.extend(kids);
        }
        at += 1;
    }
    out.into_iter()
        .map(|pid| (pid, ticks.get(&pid).copied().unwrap_or(0)))
        .collect()
}

/// The fields of `/proc/<pid>/stat` after the command name: state, ppid, ... (index 0 is the
/// state, 1 the ppid, 11 utime, 12 stime).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself hold spaces and parentheses.
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// CPU nanoseconds and resident bytes of the tree rooted at `root`; `None` once it is gone.
fn usage(root: u32) -> Option<(u64, u64)> {
    let tree = tree(root);
    if tree.is_empty() {
        return None;
    }
    let (mut ticks, mut rss_kib) = (0u64, 0u64);
    for (pid, used) in tree {
        ticks += used;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        rss_kib += status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some((ticks * (1_000_000_000 / USER_HZ), rss_kib * 1024))
}

/// The GPUs `nvidia-smi` sees; empty without the tool or when it fails.
async fn gpus() -> Vec<GpuStats> {
    let out = tokio::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=uuid,name,utilization.gpu,memory.used,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(Duration::from_secs(5), out).await {
        Ok(Ok(out)) if out.status.success() => parse_gpus(&String::from_utf8_lossy(&out.stdout)),
        _ => Vec::new(),
    }
}

/// `nvidia-smi --format=csv,noheader,nounits` lines; `[N/A]` and unparsable figures are absent.
fn parse_gpus(text: &str) -> Vec<GpuStats> {
    const MIB: u64 = 1024 * 1024;
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            let number = |i: usize| f.get(i)?.parse::<u64>().ok();
            (f.len() == 5 && !f[0].is_empty()).then(|| GpuStats {
                id: f[0].to_owned(),
                model: f[1].to_owned(),
                utilization_percent: number(2),
                memory_used_bytes: number(3).map(|m| m * MIB),
                memory_total_bytes: number(4).map(|m| m * MIB),
            })
        })
        .collect()
}

/// Samples the workload (its process tree at `root`, when the runner can see it) every `every`
/// and sends each sample, until the task is dropped.
pub async fn report(client: Arc<CallbackClient>, root: Option<u32>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<(std::time::Instant, u64)> = None;
    loop {
        tick.tick().await;
        let now = std::time::Instant::now();
        let used = root.and_then(usage);
        let nano_cores = match (used, last) {
            (Some((cpu, _)), Some((then, before))) if now > then => {
                let elapsed = now.duration_since(then).as_nanos().max(1);
                Some((u128::from(cpu.saturating_sub(before)) * 1_000_000_000 / elapsed) as u64)
            }
            _ => None,
        };
        if let Some((cpu, _)) = used {
            last = Some((now, cpu));
        }
        let stats = WorkloadStats {
            time: Utc::now(),
            cpu_usage_core_nano_seconds: used.map(|(cpu, _)| cpu),
            cpu_usage_nano_cores: nano_cores,
            memory_working_set_bytes: used.map(|(_, rss)| rss),
            gpus: gpus().await,
        };
        match client.stats(&stats).await {
            Ok(()) => {}
            Err(e) if e.status() == Some(404) => {
                tracing::info!("runner: the node takes no stats; not sending them");
                return;
            }
            Err(e) => tracing::warn!(error = %e, "runner: sending stats failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_lines_parse_and_missing_figures_are_absent() {
        let text =
            "GPU-1f2e, NVIDIA A40, 87, 20480, 46068\nGPU-9a, NVIDIA L4, [N/A], [N/A], 23034\n";
        let gpus = parse_gpus(text);
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].id, "GPU-1f2e");
        assert_eq!(gpus[0].model, "NVIDIA A40");
        assert_eq!(gpus[0].utilization_percent, Some(87));
        assert_eq!(gpus[0].memory_used_bytes, Some(20480 * 1024 * 1024));
        assert_eq!(gpus[1].utilization_percent, None);
        assert_eq!(gpus[1].memory_used_bytes, None);
        assert_eq!(gpus[1].memory_total_bytes, Some(23034 * 1024 * 1024));
        assert!(parse_gpus("").is_empty());
        assert!(parse_gpus("garbage").is_empty());
    }

    #[test]
    fn a_process_tree_counts_its_children() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let root = child.id();
        let mut seen = 0;
        for _ in 0..50 {
            seen = tree(root).len();
            if seen >= 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let (_, rss) = usage(root).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(seen >= 3, "the shell and its two sleeps: {seen}");
        assert!(rss > 0);
        assert!(usage(u32::MAX).is_none());
    }
}
