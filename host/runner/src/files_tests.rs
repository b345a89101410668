use super::*;

fn file(path: &str, mode: u32, data: &str) -> File {
    File {
        path: path.into(),
        mode,
        data: data.as_bytes().to_vec(),
    }
}

fn mount(dir: &Path, files: Vec<File>) -> FileMount {
    FileMount {
        mount_path: dir.display().to_string(),
        files,
    }
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn hidden_dirs(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("..") && n != DATA)
        .collect();
    out.sort();
    out
}

#[test]
fn files_are_written_at_the_mount_path_with_their_modes_and_replaced_atomically() {
    let root = tempfile::tempdir().unwrap();
    let at = root.path().join("etc/vllm");
    let first = vec![
        file("chat.jinja", 0o644, "v1"),
        file("hf/token", 0o400, "s3cret"),
    ];
    let mut files =
        Files::prepare(ExecutorKind::Process, &[mount(&at, first)], "c").expect("written");
    assert_eq!(
        std::fs::read_to_string(at.join("chat.jinja")).unwrap(),
        "v1"
    );
    assert_eq!(mode_of(&at.join("hf/token")), 0o400);
    assert!(
        std::fs::symlink_metadata(at.join("chat.jinja"))
            .unwrap()
            .file_type()
            .is_symlink(),
        "top-level names go through ..data"
    );
    let before = hidden_dirs(&at);
    assert_eq!(before.len(), 1, "{before:?}");

    let second = vec![file("chat.jinja", 0o644, "v2")];
    assert_eq!(files.update(&[mount(&at, second.clone())]), 1);
    assert_eq!(
        std::fs::read_to_string(at.join("chat.jinja")).unwrap(),
        "v2"
    );
    assert!(!at.join("hf").exists(), "a name that went away is unlinked");
    let after = hidden_dirs(&at);
    assert_eq!(after.len(), 1, "the old directory is removed: {after:?}");
    assert_ne!(before, after);
    assert_eq!(
        files.update(&[mount(&at, second)]),
        0,
        "unchanged files are not rewritten"
    );
}

#[test]
fn dot_dot_and_absolute_file_paths_are_refused_naming_the_file() {
    let root = tempfile::tempdir().unwrap();
    for bad in [
        "../escape",
        "a/../../escape",
        "/etc/passwd",
        "..data/x",
        "./a",
    ] {
        let m = mount(root.path(), vec![file(bad, 0o644, "x")]);
        let err = Files::prepare(ExecutorKind::Process, &[m], "c").expect_err(bad);
        assert!(err.to_string().contains(&format!("file {bad:?}")), "{err}");
    }
    let relative = FileMount {
        mount_path: "etc/x".into(),
        files: vec![],
    };
    let err = Files::prepare(ExecutorKind::Process, &[relative], "c").expect_err("relative");
    assert!(
        err.to_string().contains("must be an absolute path"),
        "{err}"
    );
    assert!(std::fs::read_dir(root.path()).unwrap().next().is_none());
}

#[test]
fn a_mount_path_that_is_a_symlink_is_refused_and_not_followed() {
    let root = tempfile::tempdir().unwrap();
    let elsewhere = root.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let at = root.path().join("link");
    symlink(&elsewhere, &at).unwrap();
    let m = mount(&at, vec![file("a", 0o644, "x")]);
    let err = Files::prepare(ExecutorKind::Process, &[m], "c").expect_err("symlink");
    assert!(err.to_string().contains("symlink"), "{err}");
    assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
}

#[test]
fn a_data_link_pointing_outside_the_mount_is_replaced_but_its_target_is_not_removed() {
    let root = tempfile::tempdir().unwrap();
    let at = root.path().join("m");
    let victim = root.path().join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("keep"), "keep").unwrap();
    let mut files = Files::prepare(
        ExecutorKind::Process,
        &[mount(&at, vec![file("a", 0o644, "1")])],
        "c",
    )
    .unwrap();
    std::fs::remove_file(at.join(DATA)).unwrap();
    symlink(&victim, at.join(DATA)).unwrap();
    files.update(&[mount(&at, vec![file("a", 0o644, "2")])]);
    assert_eq!(std::fs::read_to_string(at.join("a")).unwrap(), "2");
    assert!(
        victim.join("keep").exists(),
        "never removed outside the mount"
    );
}

#[test]
fn the_docker_executor_writes_into_its_own_directory_for_a_bind_mount() {
    let m = FileMount {
        mount_path: "/etc/app".into(),
        files: vec![file("a.conf", 0o640, "x")],
    };
    let container = format!("test-{}", uuid::Uuid::new_v4().simple());
    let files = Files::prepare(ExecutorKind::Docker, &[m], &container).unwrap();
    let mounts = files.docker_mounts();
    assert_eq!(mounts.len(), 1);
    assert_eq!(mounts[0].1, "/etc/app");
    assert!(
        mounts[0]
            .0
            .ends_with(format!("neocloud-files-{container}/0"))
    );
    assert_eq!(
        std::fs::read_to_string(mounts[0].0.join("a.conf")).unwrap(),
        "x"
    );
    std::fs::remove_dir_all(mounts[0].0.parent().unwrap()).unwrap();
}
