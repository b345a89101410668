//! The shell blocks of the README and of every page under docs/, checked against the tree: every
//! `make` target and variable they use is the Makefile's, every `cargo` package and target
//! (`-p`, `--bin`, `--bench`, `--test`, `--example`) is the workspace's, every
//! `neocloud-node ...` line parses with the binary's own argument parser (its subcommands,
//! flags and values), and every path into the repository they name is there.
//!
//! Not running them: most start a cluster, a benchmark of minutes, or a real cloud's API. The
//! guide whose commands are run as written is docs/POLICIES.md (`policy_guide.rs`); the install,
//! serving and quickstart paths run in `in_cluster.rs`, `serving.rs` and `.ci/run`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A command of a page: where it is, and its words as the shell splits them.
#[derive(Debug)]
struct Cmd {
    at: String,
    words: Vec<String>,
}

/// The shell blocks (```sh, bash, console or shell) of `text`, each as its lines.
fn shell_blocks(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Vec<String>)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut open {
            None => {
                let fence = line.trim_start().strip_prefix("```");
                if fence.is_some_and(|l| ["sh", "bash", "console", "shell"].contains(&l.trim())) {
                    open = Some((i + 2, Vec::new()));
                }
            }
            Some((start, lines)) => {
                if line.trim_start().starts_with("```") {
                    blocks.push((*start, std::mem::take(lines)));
                    open = None;
                } else {
                    lines.push(line.to_string());
                }
            }
        }
    }
    blocks
}

/// The words of one shell line, quotes removed, up to a comment; the operators `&&`, `||`,
/// `;`, `|`, `&` and redirections stand as words of their own.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    started = true;
                }
                '#' if !started => break,
                ' ' | '\t' => {
                    if started {
                        out.push(std::mem::take(&mut word));
                        started = false;
                    }
                }
                '&' | '|' | ';' | '>' | '<' if !started => {
                    let mut op = c.to_string();
                    while let Some(&n) = chars.peek() {
                        if n == c || (c == '>' && n == '&') {
                            op.push(n);
                            chars.next();
                        } else {
                            break;
                        }
                    }
                    out.push(op);
                }
                _ => {
                    word.push(c);
                    started = true;
                }
            },
        }
    }
    if started {
        out.push(word);
    }
    out
}

/// Every command of every shell block of `pages`: continuation lines joined, split at the
/// shell's operators, leading `VAR=value` assignments and `time` kept out.
fn commands(pages: &[(String, String)]) -> Vec<Cmd> {
    let mut out = Vec::new();
    for (name, text) in pages {
        for (start, lines) in shell_blocks(text) {
            let mut joined: Vec<(usize, String)> = Vec::new();
            let mut carry = false;
            for (i, line) in lines.iter().enumerate() {
                let (body, continues) = match line.trim_end().strip_suffix('\\') {
                    Some(body) => (body.to_string(), true),
                    None => (line.clone(), false),
                };
                match joined.last_mut() {
                    Some((_, last)) if carry => last.push_str(&body),
                    _ => joined.push((start + i, body)),
                }
                carry = continues;
            }
            for (line_no, line) in joined {
                let mut current: Vec<String> = Vec::new();
                let mut redirect = false;
                for w in words(&line).into_iter().chain([";".to_string()]) {
                    if ["&&", "||", ";", "|", "&"].contains(&w.as_str()) {
                        let cmd: Vec<String> = current
                            .drain(..)
                            .skip_while(|w| is_assignment(w) || w == "time")
                            .collect();
                        if !cmd.is_empty() {
                            out.push(Cmd {
                                at: format!("{name}:{line_no}"),
                                words: cmd,
                            });
                        }
                    } else if w.starts_with('>') || w.starts_with('<') {
                        redirect = true;
                    } else if redirect {
                        redirect = false;
                    } else {
                        current.push(w);
                    }
                }
            }
        }
    }
    out
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

/// The Makefile's targets, and the text every variable must appear in.
fn make_targets(makefile: &str) -> BTreeSet<String> {
    makefile
        .lines()
        .filter(|l| !l.starts_with('\t') && !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, rest)| !rest.starts_with('=') && !name.contains(['$', ' ', '=']))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// Each workspace package with the names of its targets by kind (`bin`, `bench`, `test`,
/// `example`), from `cargo metadata`.
type Packages = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn workspace_packages() -> Packages {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let mut packages = Packages::new();
    for p in meta["packages"].as_array().expect("packages") {
        let targets = packages
            .entry(p["name"].as_str().expect("name").to_string())
            .or_default();
        for t in p["targets"].as_array().expect("targets") {
            for kind in t["kind"].as_array().expect("kind") {
                targets
                    .entry(kind.as_str().expect("kind").to_string())
                    .or_default()
                    .insert(t["name"].as_str().expect("target name").to_string());
            }
        }
    }
    packages
}

/// The repository's top-level folders a command may name a path in (not `target/`, which a
/// build makes).
const TREE: &[&str] = &[
    "config/",
    "deploy/",
    "docs/",
    "examples/",
    "fuzz/",
    "hack/",
    "host/",
    "wit/",
];

/// Whether `path` names something the repository holds and is missing. Built outputs
/// (`policies/build/`) and paths with shell expansions are not checked.
fn missing_path(path: &str) -> bool {
    let path = path.rsplit_once('=').map_or(path, |(_, p)| p);
    let named = TREE.iter().any(|top| path.starts_with(top))
        || (path.starts_with("policies/") && !path.starts_with("policies/build/"));
    named && !path.contains(['$', '*', '<']) && !repo().join(path).exists()
}

/// What is wrong with `cmd`, if anything.
fn check(cmd: &Cmd, makefile: &str, packages: &Packages, node: &Path) -> Vec<String> {
    let mut wrong = Vec::new();
    let w = &cmd.words;
    let program = w[0].rsplit('/').next().unwrap_or(&w[0]);
    // kubectl's `deploy/name` is a resource, not a path: only its files are checked.
    let paths: Vec<&String> = if program == "kubectl" {
        let file_flags = ["-f", "-k", "--filename", "--kustomize"];
        let mut files: Vec<&String> = w
            .windows(2)
            .filter(|p| file_flags.contains(&p[0].as_str()))
            .map(|p| &p[1])
            .collect();
        files.extend(w.iter().filter(|x| x.starts_with("--from-file=")));
        files
    } else {
        w.iter().collect()
    };
    for word in paths {
        if missing_path(word) {
            wrong.push(format!(
                "{}: `{}` names {word}, which is not in the tree",
                cmd.at,
                w.join(" ")
            ));
        }
    }
    // Placeholders a reader fills in (`...`, `<namespace>`) are not checked further.
    if w.iter().any(|x| x.contains("...") || x.starts_with('<')) {
        return wrong;
    }
    match program {
        "make" => {
            let targets = make_targets(makefile);
            for arg in &w[1..] {
                if let Some((var, _)) = arg.split_once('=') {
                    if !makefile.contains(&format!("$({var})")) {
                        wrong.push(format!(
                            "{}: make variable {var} is not used by the Makefile",
                            cmd.at
                        ));
                    }
                } else if !arg.starts_with('-') && !targets.contains(arg) {
                    wrong.push(format!(
                        "{}: make target `{arg}` is not in the Makefile",
                        cmd.at
                    ));
                }
            }
        }
        "cargo" => {
            let (before, after) = match w.iter().position(|x| x == "--") {
                Some(i) => (&w[..i], Some(&w[i + 1..])),
                None => (&w[..], None),
            };
            let package = flag(before, "-p");
            if let Some(p) = &package {
                match packages.get(p) {
                    None => wrong.push(format!(
                        "{}: cargo package {p} is not in the workspace",
                        cmd.at
                    )),
                    Some(targets) => {
                        for kind in ["bin", "bench", "test", "example"] {
                            if let Some(name) = flag(before, &format!("--{kind}")) {
                                let known = targets.get(kind).is_some_and(|t| t.contains(&name));
                                if !known {
                                    wrong.push(format!(
                                        "{}: {p} has no {kind} target `{name}`",
                                        cmd.at
                                    ));
                                }
                            }
                        }
                    }
                }
            }
            if before.get(1).is_some_and(|s| s == "run")
                && package.as_deref() == Some("neocloud-node")
                && let Some(args) = after
            {
                wrong.extend(node_args(cmd, args, node));
            }
        }
        "neocloud-node" => wrong.extend(node_args(cmd, &w[1..], node)),
        _ => {}
    }
    wrong
}

/// The value of `name` in `words` (`name value` or `name=value`).
fn flag(words: &[String], name: &str) -> Option<String> {
    words.iter().enumerate().find_map(|(i, w)| {
        if w == name {
            words.get(i + 1).cloned()
        } else {
            w.strip_prefix(&format!("{name}=")).map(str::to_string)
        }
    })
}

/// Whether the binary's parser takes `args`: they are given with `--help` appended, which
/// prints the help of the subcommand they reach (exit 0) once every word before it parsed, and
/// fails naming an unknown subcommand, flag or value otherwise.
fn node_args(cmd: &Cmd, args: &[String], node: &Path) -> Vec<String> {
    let out = Command::new(node)
        .args(args)
        .arg("--help")
        .output()
        .expect("neocloud-node runs");
    if out.status.success() {
        Vec::new()
    } else {
        vec![format!(
            "{}: `neocloud-node {}` does not parse: {}",
            cmd.at,
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )]
    }
}

/// The README and every page under docs/, by name.
fn pages() -> Vec<(String, String)> {
    let mut pages = vec![("README.md".to_string(), read(&repo().join("README.md")))];
    for entry in std::fs::read_dir(repo().join("docs")).expect("docs/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            let name = format!("docs/{}", path.file_name().unwrap().to_string_lossy());
            pages.push((name, read(&path)));
        }
    }
    pages.sort();
    pages
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn node_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_neocloud-node"))
}

#[test]
fn every_command_in_the_readme_and_docs_names_what_the_tree_has() {
    let makefile = read(&repo().join("Makefile"));
    let packages = workspace_packages();
    let cmds = commands(&pages());
    let count = |p: &str| cmds.iter().filter(|c| c.words[0].ends_with(p)).count();
    // The pages' commands are found at all: a parser that found none would pass anything.
    assert!(
        count("make") >= 10 && count("cargo") >= 10 && count("neocloud-node") >= 5,
        "{cmds:#?}"
    );
    let wrong: Vec<String> = cmds
        .iter()
        .flat_map(|c| check(c, &makefile, &packages, &node_binary()))
        .collect();
    assert!(
        wrong.is_empty(),
        "commands in the docs that do not match the tree:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_wrong_target_flag_package_or_path_in_a_page_is_found() {
    let page = "text\n```sh\nmake verfy && make replay REPLAY_SEEDS=7\n\
        cargo bench -p neocloud-node --bench lode\ncargo run -p neocloud-nodes -- crds\n\
        cargo run -p neocloud-node -- policy chek x.wasm   # a typo\n\
        neocloud-node cost report --bye namespace > out.csv\n\
        kubectl apply -f config/samples/nope.yaml\n\
        LOAD_IMPLS=vk \\\n  cargo test -p neocloud-node --test serving\n```\n";
    let cmds = commands(&[("T.md".to_string(), page.to_string())]);
    let wrong: Vec<String> = cmds
        .iter()
        .flat_map(|c| {
            check(
                c,
                &read(&repo().join("Makefile")),
                &workspace_packages(),
                &node_binary(),
            )
        })
        .collect();
    let has = |s: &str| wrong.iter().any(|w| w.contains(s));
    assert!(has("T.md:3: make target `verfy`"), "{wrong:#?}");
    assert!(has("make variable REPLAY_SEEDS"), "{wrong:#?}");
    assert!(
        has("T.md:4: neocloud-node has no bench target `lode`"),
        "{wrong:#?}"
    );
    assert!(has("cargo package neocloud-nodes"), "{wrong:#?}");
    assert!(
        has("T.md:6: `neocloud-node policy chek x.wasm` does not parse"),
        "{wrong:#?}"
    );
    assert!(
        has("`neocloud-node cost report --bye namespace` does not parse"),
        "{wrong:#?}"
    );
    assert!(
        has("names config/samples/nope.yaml, which is not in the tree"),
        "{wrong:#?}"
    );
    // The continued line is one command, and its assignment is not a word of it; it is right.
    assert!(
        cmds.iter()
            .any(|c| c.at == "T.md:9" && c.words[0] == "cargo"),
        "{cmds:#?}"
    );
    assert_eq!(wrong.len(), 7, "{wrong:#?}");
}
