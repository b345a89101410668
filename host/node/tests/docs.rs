//! The README and the pages under docs/, checked against the code: the README stays short (a
//! newcomer reads it whole) and names every metric the node exports and every annotation a Pod
//! may carry, and no relative link in any page points at a file that is not there.
//!
//! Not the guides' commands: docs/POLICIES.md is run as written by `policy_guide.rs`, and every
//! other shell block is checked against the tree by `doc_commands.rs`. The
//! configuration reference is generated from the config types, and examples/node.yaml sets every
//! setting it names.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use neocloud_core::translate::KNOWN_ANNOTATIONS;
use neocloud_node::metrics::Metrics;

/// The README's length the house rules allow; the rest belongs in docs/.
const README_MAX_LINES: usize = 300;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The README and every Markdown page under docs/ (not the generated replay reports' folders).
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![repo().join("README.md")];
    let docs = repo().join("docs");
    for entry in std::fs::read_dir(&docs).expect("docs/") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages.sort();
    pages
}

/// The targets of the page's Markdown links `[text](target)` that are not URLs or anchors,
/// without their `#fragment`.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        let target = target.split('#').next().unwrap_or_default();
        let is_url = target.contains("://") || target.starts_with("mailto:");
        if !target.is_empty() && !is_url && !target.contains(char::is_whitespace) {
            links.push(target.to_owned());
        }
    }
    links
}

/// The names in the first column of the README's table under `## {section}`.
fn first_column(readme: &str, section: &str) -> BTreeSet<String> {
    let heading = format!("## {section}\n");
    let start = readme
        .find(&heading)
        .unwrap_or_else(|| panic!("the README has no \"## {section}\" section"));
    let body = &readme[start + heading.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    body.lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            let cell = l.split('|').nth(1).unwrap_or_default();
            cell.split(',')
                .map(|name| name.trim().trim_matches('`').to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_readme_is_short_enough_to_read_whole() {
    let lines = read(&repo().join("README.md")).lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, over {README_MAX_LINES}: move detail into a page under docs/ \
         and link it from the README's table of pages"
    );
}

#[test]
fn every_relative_link_in_the_readme_and_docs_points_at_a_file() {
    let mut broken = Vec::new();
    for page in pages() {
        let base = page.parent().expect("a page is in a folder");
        for target in relative_links(&read(&page)) {
            if !base.join(&target).exists() {
                let page = page
                    .strip_prefix(repo())
                    .unwrap_or(&page)
                    .display()
                    .to_string();
                broken.push(format!("{page}: {target}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links to no file:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_readme_lists_every_metric_the_node_exports_and_no_other() {
    let exported = Metrics::every_family_name();
    let listed = first_column(&read(&repo().join("README.md")), "Metrics");
    assert_eq!(
        listed, exported,
        "the README's Metrics table and the node's metrics differ"
    );
}

#[test]
fn the_readme_lists_every_annotation_a_pod_may_carry_and_no_other() {
    let known: BTreeSet<String> = KNOWN_ANNOTATIONS.iter().map(|a| a.to_string()).collect();
    let listed = first_column(&read(&repo().join("README.md")), "Annotations");
    assert_eq!(
        listed, known,
        "the README's Annotations table and the translation differ"
    );
}

#[test]
fn a_link_to_a_missing_file_is_found() {
    let links = relative_links(
        "see [a](docs/A.md#x), [b](https://example.com/b), [c](#anchor) and [d](../d.md)",
    );
    assert_eq!(links, ["docs/A.md", "../d.md"]);
    let table =
        "## Metrics\n\n| name | type |\n| --- | --- |\n| `a`, `b` | gauge |\n\n## Next\n| `c` |\n";
    assert_eq!(
        first_column(table, "Metrics"),
        BTreeSet::from(["a".to_owned(), "b".to_owned()])
    );
}

/// docs/CONFIGURATION.md is what `neocloud-node config reference` makes from the config types
/// today: a setting added, renamed or re-documented without regenerating it fails here.
#[test]
fn the_configuration_reference_is_generated_from_the_config_types() {
    let page = read(&repo().join("docs/CONFIGURATION.md"));
    let made = neocloud_node::run::config_reference::markdown();
    assert!(
        page == made,
        "docs/CONFIGURATION.md is stale: run `make config-reference` and commit it"
    );
}

/// examples/node.yaml, with its commented-out settings written in, is a configuration the node
/// accepts (unknown fields are refused) and sets every setting of the reference.
#[test]
fn the_example_configuration_shows_every_setting() {
    let example = read(&repo().join("examples/node.yaml"));
    let written = uncommented(&example);
    neocloud_node::run::RunConfig::from_yaml(&written)
        .unwrap_or_else(|e| panic!("examples/node.yaml, uncommented: {e:#}\n{written}"));
    let value: serde_json::Value = serde_yaml::from_str(&written).expect("YAML");
    let missing: Vec<String> = neocloud_node::run::config_reference::settings()
        .into_iter()
        .map(|s| s.path)
        .filter(|path| !sets(&value, path))
        .collect();
    assert!(
        missing.is_empty(),
        "examples/node.yaml does not show {missing:?}"
    );
}

/// The example with `# ` taken off every commented-out setting (a line whose text after its
/// indent and `# ` is `key:` or `- key:`, with `key` a setting's name); prose comments stay.
fn uncommented(example: &str) -> String {
    let names: BTreeSet<String> = neocloud_node::run::config_reference::settings()
        .iter()
        .flat_map(|s| {
            s.path
                .split('.')
                .map(|p| p.trim_end_matches("[]").to_owned())
        })
        .collect();
    let setting = |text: &str| {
        let text = text.trim_start().trim_start_matches("- ");
        let key: String = text
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        names.contains(&key) && text[key.len()..].starts_with(':')
    };
    example
        .lines()
        .map(|line| {
            let indent = &line[..line.len() - line.trim_start().len()];
            match line.trim_start().strip_prefix("# ") {
                Some(text) if setting(text) => format!("{indent}{text}"),
                _ => line.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `value` sets `path` (`a.b`, `list[].c`: some item of the list sets `c`).
fn sets(value: &serde_json::Value, path: &str) -> bool {
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    };
    let (key, each) = match head.strip_suffix("[]") {
        Some(key) => (key, true),
        None => (head, false),
    };
    let Some(child) = value.get(key) else {
        return false;
    };
    match (rest, each) {
        (None, _) => true,
        (Some(rest), true) => child
            .as_array()
            .is_some_and(|items| items.iter().any(|item| sets(item, rest))),
        (Some(rest), false) => sets(child, rest),
    }
}
