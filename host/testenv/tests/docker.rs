//! Proves the test Docker engine is real and leaves nothing behind: an imported busybox image
//! runs with its entrypoint and the given args, exits with their code, and once the engine is
//! dropped its directory, its mounts and its processes are gone.

use neocloud_testenv::Docker;

#[tokio::test]
async fn the_engine_runs_an_imported_image_and_leaves_nothing_behind() {
    let docker = Docker::start().await.unwrap_or_else(|e| panic!("{e}"));
    docker
        .import_busybox("neocloud-test/busybox:1")
        .unwrap_or_else(|e| panic!("{e}"));
    let out = docker
        .command()
        .args(["run", "--rm", "--network=none", "neocloud-test/busybox:1"])
        .arg("echo $0 ran; exit 5")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", docker.log_tail(20));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "/bin/sh ran\n");
    // Without args the image's CMD runs.
    let default = docker
        .command()
        .args(["run", "--rm", "--network=none", "neocloud-test/busybox:1"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&default.stdout), "from the image\n");

    let dir = docker.dir().to_owned();
    drop(docker);
    assert!(!dir.exists(), "{} is removed", dir.display());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let prefix = dir.display().to_string();
    assert!(
        !mounts.lines().any(|l| l.contains(&prefix)),
        "no mount is left under {prefix}"
    );
    let ps = std::process::Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .unwrap();
    let left = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !left.lines().any(|l| l.contains(&prefix)),
        "no process of the engine is left: {left}"
    );
}
