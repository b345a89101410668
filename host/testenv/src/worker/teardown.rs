//! Tearing a worker node down when it is dropped: its components stopped, every container
//! process and shim killed, mounts, cgroups and the namespace removed, the sysctls restored;
//! and [`Leftovers`], what a node left behind (for tests of the harness itself).
//!
//! Not the host reads it relies on (`host`).

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::WorkerNode;
use super::host::{
    cgroup_hierarchies, host_iptables_rules, ip, mounts_under, processes_mentioning, read_sysctl,
    subtree,
};

impl WorkerNode {
    /// Kills every process in the node's cgroups (its containers) and every containerd shim of
    /// this node.
    pub(super) fn kill_workloads(&self) {
        let socket = self.socket().display().to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut pids: Vec<i32> = cgroup_hierarchies()
                .iter()
                .flat_map(|h| subtree(&h.join(&self.cgroup)))
                .filter_map(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
                .flat_map(|procs| {
                    procs
                        .lines()
                        .filter_map(|l| l.trim().parse::<i32>().ok())
                        .collect::<Vec<_>>()
                })
                .collect();
            pids.extend(
                processes_mentioning(&socket)
                    .into_iter()
                    .map(|(pid, _)| pid),
            );
            pids.sort_unstable();
            pids.dedup();
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub(super) fn teardown(&mut self) {
        // Asked while containerd still answers: the kubelet removes a Pod's namespace only when
        // it removes the Pod's sandbox, which it does not do for Pods left running.
        let pod_netns = self.pod_netns();
        if let Some(mut kube_proxy) = self.kube_proxy.take() {
            kube_proxy.stop();
        }
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop();
        }
        self.kill_workloads();
        if let Some(mut containerd) = self.containerd.take() {
            containerd.stop();
        }
        self.kill_workloads();
        for point in mounts_under(&self.dir) {
            let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
        }
        for hierarchy in cgroup_hierarchies() {
            for dir in subtree(&hierarchy.join(&self.cgroup)) {
                let _ = std::fs::remove_dir(&dir);
            }
        }
        for path in pod_netns {
            let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
            let _ = std::fs::remove_file(&path);
        }
        let _ = ip(&["netns", "del", &self.netns]);
        for (name, value) in &self.sysctls {
            let path = Path::new("/proc/sys").join(name);
            if let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(&path) {
                let _ = writeln!(file, "{value}");
            }
        }
        self.forwarder.take();
        self.exposed.clear();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// What the node left behind, once dropped (for tests of the harness itself).
    pub fn leftovers_after(self) -> Leftovers {
        let (dir, netns, cgroup) = (self.dir.clone(), self.netns.clone(), self.cgroup.clone());
        let sysctls = self.sysctls.clone();
        let host_rules = self.host_rules.clone();
        let pod_netns = self.pod_netns();
        drop(self);
        let mut left = Leftovers::of(&dir, &netns, &cgroup, &sysctls);
        for rule in host_iptables_rules() {
            if !host_rules.contains(&rule) {
                left.0.push(format!("host iptables rule {rule}"));
            }
        }
        for path in pod_netns {
            if path.exists() {
                left.0
                    .push(format!("Pod network namespace {}", path.display()));
            }
        }
        left
    }
}

impl Drop for WorkerNode {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// What a worker node left behind; empty when it cleaned up after itself.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Leftovers(pub Vec<String>);

impl Leftovers {
    /// Everything of a node that should be gone: mounts under its directory, the directory,
    /// processes mentioning it, its cgroups, its network namespace, and sysctls not back to
    /// `sysctls`.
    pub fn of(dir: &Path, netns: &str, cgroup: &str, sysctls: &[(String, String)]) -> Leftovers {
        let mut left = Vec::new();
        for point in mounts_under(dir) {
            left.push(format!("mount {}", point.display()));
        }
        if dir.exists() && std::env::var_os("NEOCLOUD_TESTENV_KEEP").is_none() {
            left.push(format!("directory {}", dir.display()));
        }
        for (pid, line) in processes_mentioning(&dir.display().to_string()) {
            left.push(format!("process {pid}: {line}"));
        }
        for hierarchy in cgroup_hierarchies() {
            let path = hierarchy.join(cgroup);
            if path.exists() {
                left.push(format!("cgroup {}", path.display()));
            }
        }
        if Path::new("/run/netns").join(netns).exists() {
            left.push(format!("network namespace {netns}"));
        }
        for (name, value) in sysctls {
            if let Ok(now) = read_sysctl(name)
                && &now != value
            {
                left.push(format!("sysctl {name} is {now}, was {value}"));
            }
        }
        Leftovers(left)
    }
}
