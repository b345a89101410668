//! Supervised child processes whose lifetime is tied to the test process.
//!
//! Each component runs under a small bash supervisor that polls the test process's pid: when the
//! test binary exits for any reason (success, panic, abort, SIGKILL), the supervisor stops the
//! component within a second. Dropping a [`Supervised`] stops it at once. This is why a control
//! plane kept in a `static` (never dropped) still leaves nothing running.
//!
//! It is not a process manager: no restarts, no resource limits.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::Error;

/// The supervisor: runs "$@", stops it when pid $1 is gone or on SIGTERM, and removes the paths
/// in NEOCLOUD_TESTENV_CLEANUP (if any, unmounting what is mounted under them) after the child
/// has stopped. The trap is set before the child starts: a SIGTERM that came between the two
/// (a test stopping a component as soon as it logged) killed the supervisor without its cleanup.
const SUPERVISOR: &str = r#"
watch=$1; shift
child=
stop() {
  [ -n "$child" ] || child=$!
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
  for _ in $(seq 1 50); do kill -0 "$child" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$child" 2>/dev/null
  wait "$child" 2>/dev/null
  if [ -n "${NEOCLOUD_TESTENV_CLEANUP:-}" ]; then
    # Mounts the component left under its directories go first (dockerd's netns bind mount).
    for d in $NEOCLOUD_TESTENV_CLEANUP; do
      awk -v d="$d/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
        while read -r m; do umount -l "$m" 2>/dev/null; done
    done
    rm -rf $NEOCLOUD_TESTENV_CLEANUP
  fi
  exit 0
}
trap stop TERM INT
"$@" &
child=$!
while kill -0 "$watch" 2>/dev/null; do
  if ! kill -0 "$child" 2>/dev/null; then wait "$child"; exit $?; fi
  sleep 0.5 & wait $!
done
stop
"#;

/// One component of the control plane, running under its supervisor, logging to a file.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    /// Starts `program args...` with stdout and stderr appended to `log`.
    /// `cleanup` names directories the supervisor removes once the component has stopped.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
        cleanup: Option<&Path>,
    ) -> Result<Self, Error> {
        let out =
            File::create(log).map_err(|e| Error::io(format!("create {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io("clone log handle", e))?;
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(SUPERVISOR)
            .arg("neocloud-testenv-supervisor");
        cmd.arg(std::process::id().to_string())
            .arg(program)
            .args(args);
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        if let Some(dir) = cleanup {
            cmd.env("NEOCLOUD_TESTENV_CLEANUP", dir);
        }
        let child = cmd
            .spawn()
            .map_err(|e| Error::io(format!("start {name} ({})", program.display()), e))?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
        })
    }

    /// The component's name, such as `kube-apiserver`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file holding the component's stdout and stderr.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` if the component (and so its supervisor) has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Stops the component: SIGTERM, then SIGKILL after five seconds; waits for it.
    pub fn stop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(8);
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last `lines` lines of the component's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The last `lines` lines of a file, or a note saying why it could not be read.
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("<cannot read {}: {e}>", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_only_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        std::fs::write(&path, "a\nb\nc\nd\n").unwrap();
        assert_eq!(log_tail(&path, 2), "c\nd");
        assert_eq!(log_tail(&path, 10), "a\nb\nc\nd");
    }

    #[test]
    fn log_tail_of_a_missing_file_says_so() {
        let tail = log_tail(Path::new("/nonexistent/neocloud.log"), 5);
        assert!(
            tail.contains("cannot read /nonexistent/neocloud.log"),
            "{tail}"
        );
    }

    #[test]
    fn stopping_a_supervised_process_ends_its_child() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sleep.log");
        let marker = dir.path().join("cleanup-me");
        std::fs::create_dir(&marker).unwrap();
        let args = vec!["-c".to_owned(), "echo started; exec sleep 300".to_owned()];
        let mut p =
            Supervised::spawn("sleeper", Path::new("bash"), &args, &log, Some(&marker)).unwrap();
        wait_for(|| log_tail(&log, 1) == "started");
        assert!(
            p.exited().is_none(),
            "the supervisor must keep running while its child does"
        );
        p.stop();
        assert!(p.exited().is_some());
        wait_for(|| !marker.exists());
    }

    #[test]
    fn a_child_that_exits_is_reported_with_its_status() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("fail.log");
        let args = vec!["-c".to_owned(), "echo boom >&2; exit 3".to_owned()];
        let mut p = Supervised::spawn("failer", Path::new("bash"), &args, &log, None).unwrap();
        wait_for(|| p.exited().is_some());
        assert_eq!(p.exited().and_then(|s| s.code()), Some(3));
        assert_eq!(p.log_tail(5), "boom");
    }

    fn wait_for(mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "condition not met within 10s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
