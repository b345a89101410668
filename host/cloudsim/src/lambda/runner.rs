//! Opt-in (`run_user_data`): what cloud-init would do on a real VM, reduced to the one command
//! NeoCloud cares about. When an instance launched with `#cloud-config` `user_data` becomes
//! active, the `neocloud-runner …` entry of its `runcmd` (in list or string form, possibly
//! behind a prefix such as `systemd-run …`) is started as a local child process, with
//! `runner_binary` in place of the path written in `user_data`. Terminating, restarting or
//! preempting the instance kills it, as does dropping the simulator (see `crate::runner`, which
//! starts and kills the process).
//!
//! The runner's secrets file (`--secrets-file`, written by `write_files`) becomes environment
//! of the runner's instead (see [`crate::runner::take_secrets_file`]).
//!
//! Not cloud-init: other `runcmd` entries, other `write_files`, packages and shell quoting in
//! string entries are ignored.

use std::path::Path;

use crate::runner::{RUNNER_BINARY, RunnerCommand};

/// The arguments after the `neocloud-runner` binary in `user_data`'s `runcmd`, and the
/// environment its `systemd-run` prefix gives it, if the `user_data` is `#cloud-config` and
/// has such an entry.
pub(crate) fn runner_command(user_data: &str) -> Option<RunnerCommand> {
    let (prefix, mut args) = runner_entry(user_data)?;
    let mut env = setenv(&prefix);
    if let Some(path) = crate::runner::take_secrets_file(&mut args) {
        let content = written_file(user_data, &path).unwrap_or_default();
        for line in content.lines() {
            if let Some((name, value)) = line.split_once('=') {
                env.push((name.to_owned(), value.to_owned()));
            }
        }
    }
    Some((args, env))
}

/// The content `write_files` gives the file at `path`.
fn written_file(user_data: &str, path: &str) -> Option<String> {
    let doc: serde_yaml::Value = serde_yaml::from_str(user_data).ok()?;
    let files = doc.get("write_files")?.as_sequence()?;
    files
        .iter()
        .find(|f| f.get("path").and_then(|p| p.as_str()) == Some(path))
        .and_then(|f| f.get("content")?.as_str().map(str::to_owned))
}

/// The environment `systemd-run` words give the unit (`--setenv=NAME=VALUE`, `-E NAME=VALUE`,
/// `--setenv NAME=VALUE`), as systemd would.
fn setenv(prefix: &[String]) -> Vec<(String, String)> {
    let mut env = Vec::new();
    let mut words = prefix.iter();
    while let Some(word) = words.next() {
        let pair = match word.strip_prefix("--setenv=") {
            Some(pair) => Some(pair.to_owned()),
            None if word == "--setenv" || word == "-E" => words.next().cloned(),
            None => None,
        };
        if let Some((name, value)) = pair.as_deref().and_then(|p| p.split_once('=')) {
            env.push((name.to_owned(), value.to_owned()));
        }
    }
    env
}

/// The words before and after the `neocloud-runner` binary in `user_data`'s `runcmd`.
fn runner_entry(user_data: &str) -> Option<(Vec<String>, Vec<String>)> {
    if !user_data.trim_start().starts_with("#cloud-config") {
        return None;
    }
    let doc: serde_yaml::Value = serde_yaml::from_str(user_data).ok()?;
    let entries = doc.get("runcmd")?.as_sequence()?;
    entries.iter().find_map(|entry| {
        let argv: Vec<String> = match entry {
            serde_yaml::Value::String(line) => {
                line.split_whitespace().map(str::to_string).collect()
            }
            serde_yaml::Value::Sequence(items) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<_>>()?,
            _ => return None,
        };
        let at = argv.iter().position(|arg| is_runner_binary(arg))?;
        Some((argv[..at].to_vec(), argv[at + 1..].to_vec()))
    })
}

/// Whether `arg` is a path to the runner binary (not, say, a shell script that downloads it).
fn is_runner_binary(arg: &str) -> bool {
    !arg.contains(char::is_whitespace)
        && Path::new(arg)
            .file_name()
            .is_some_and(|n| n == RUNNER_BINARY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner_args(user_data: &str) -> Option<Vec<String>> {
        runner_command(user_data).map(|(args, _)| args)
    }

    fn runner_env(user_data: &str) -> Vec<(String, String)> {
        runner_command(user_data)
            .map(|(_, env)| env)
            .unwrap_or_default()
    }

    #[test]
    fn runner_args_come_from_a_list_entry_behind_a_prefix() {
        let user_data = "#cloud-config\nruncmd:\n  - [sh, -c, 'echo hi']\n  - [systemd-run, \
                         --unit=x, /usr/local/bin/neocloud-runner, --callback-url, \
                         'https://n:1']\n";
        assert_eq!(
            runner_args(user_data),
            Some(vec!["--callback-url".into(), "https://n:1".into()])
        );
    }

    #[test]
    fn runner_args_come_from_a_string_entry() {
        let user_data = "#cloud-config\nruncmd:\n  - neocloud-runner --executor process\n";
        assert_eq!(
            runner_args(user_data),
            Some(vec!["--executor".into(), "process".into()])
        );
    }

    #[test]
    fn the_download_step_before_the_runner_is_not_taken_for_it() {
        let user_data = "#cloud-config\nruncmd:\n  - [sh, -c, 'curl -o /usr/local/bin/neocloud-runner \
                         x && chmod 0755 /usr/local/bin/neocloud-runner']\n  - \
                         [/usr/local/bin/neocloud-runner, --executor, process]\n";
        assert_eq!(
            runner_args(user_data),
            Some(vec!["--executor".into(), "process".into()])
        );
    }

    #[test]
    fn the_secrets_file_written_by_write_files_reaches_the_runner_as_environment() {
        let user_data = "#cloud-config\nwrite_files:\n  - path: /run/x/secrets\n    \
                         permissions: '0600'\n    content: \"A=1\\nB=two=2\\n\"\n  - path: /etc/other\n    \
                         content: \"C=3\"\nruncmd:\n  - [systemd-run, --quiet, neocloud-runner, \
                         --executor, process, --secrets-file, /run/x/secrets]\n";
        assert_eq!(
            runner_args(user_data),
            Some(vec!["--executor".into(), "process".into()])
        );
        assert_eq!(
            runner_env(user_data),
            vec![
                ("A".to_owned(), "1".to_owned()),
                ("B".to_owned(), "two=2".to_owned())
            ]
        );
    }

    #[test]
    fn user_data_without_a_runner_runs_nothing() {
        assert_eq!(runner_args("#cloud-config\n"), None);
        assert_eq!(
            runner_env(
                "#cloud-config\nruncmd:\n  - [systemd-run, --setenv=A=1=2, -E, B=x, --quiet, \
                 /usr/local/bin/neocloud-runner, --setenv=C=no]\n"
            ),
            vec![
                ("A".to_owned(), "1=2".to_owned()),
                ("B".to_owned(), "x".to_owned())
            ]
        );
        assert_eq!(runner_args("#!/bin/sh\nneocloud-runner\n"), None);
        assert_eq!(
            runner_args("#cloud-config\nruncmd:\n  - [neocloud-node, runner]\n"),
            None
        );
        assert_eq!(
            runner_args("#cloud-config\nruncmd:\n  - [cp, /tmp/neocloud-runner.new, /usr/bin]\n"),
            None
        );
    }
}
