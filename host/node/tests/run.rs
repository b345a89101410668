//! `neocloud-node run` as a process on the real control plane with the simulators: killed with
//! SIGKILL at random points of creates and deletes, fifty times in a row, and restarted, it leaves
//! exactly one instance per live Pod and none for deleted Pods; with two replicas, the standby
//! takes over when the leader dies, and serves readiness and metrics; and a chaos run kills
//! whichever of two replicas leads, again and again, while Pods come and go, the simulators
//! inject faults and a cluster budget caps the spend.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use neocloud_cloudsim::{CloudSim, FaultKind, FaultRule};
use neocloud_node::crd::CloudPodBinding;
use neocloud_testenv::TestContext;
use serde_json::json;
use tokio::process::Child;

mod support;
use support::{fast_sims, free_port, http_get, node_process};

struct World {
    ctx: TestContext,
    sims: CloudSim,
    node: String,
    dir: tempfile::TempDir,
}

/// The directory holding the nodes' configs and logs; `NEOCLOUD_TEST_KEEP_DIR` keeps it after
/// the test (its path is printed) so a failed long run can be read afterwards.
fn test_dir() -> tempfile::TempDir {
    let mut dir = tempfile::tempdir().unwrap();
    if std::env::var_os("NEOCLOUD_TEST_KEEP_DIR").is_some() {
        dir.disable_cleanup(true);
        eprintln!("keeping {}", dir.path().display());
    }
    dir
}

impl World {
    async fn new(prefix: &str) -> World {
        let ctx = TestContext::new(prefix).await;
        let sims = fast_sims().await;
        let node = format!("neocloud-{}", ctx.namespace);
        World {
            ctx,
            sims,
            node,
            dir: test_dir(),
        }
    }

    /// Writes a config serving metrics on `port` and returns its path.
    fn config(&self, port: u16) -> PathBuf {
        let yaml = format!(
            "clusterId: runtest\n\
             node: {{name: {node}, leaseRenewSeconds: 1, kubeletPort: {kubelet}}}\n\
             providers: [runpod, vast]\n\
             installCrds: true\n\
             metricsAddress: 127.0.0.1:{port}\n\
             healthIntervalSeconds: 1\n\
             leaderElection: {{namespace: {ns}, leaseDurationSeconds: 2, renewGraceSeconds: 1}}\n\
             reconciler: {{pollIntervalMs: 300, retryIntervalMs: 1000}}\n\
             sweeper: {{intervalSeconds: 3600, graceSeconds: 3600}}\n\
             spend: {{labels: [namespace, team, provider], teamLabel: example.com/team}}\n",
            node = self.node,
            ns = self.ctx.namespace,
            kubelet = free_port(),
        );
        let path = self.dir.path().join(format!("node-{port}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn spawn(&self, config: &Path, log: &str) -> Child {
        let log = std::fs::File::create(self.dir.path().join(log)).unwrap();
        node_process(config, &self.ctx, &self.sims, log)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.ctx.client.clone(), &self.ctx.namespace)
    }

    async fn create_pod(&self, name: &str) {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"example.com/team": "vision"}},
            "spec": {
                "nodeName": self.node,
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "registry.invalid/cuda:12",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
            }
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    async fn wait_running(&self, name: &str, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let pod = self.pods().get(name).await.unwrap();
            if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pod {name} is not Running after {within:?}: {:?}\n{}",
                pod.status,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_gone(&self, name: &str, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.pods().get_opt(name).await.unwrap().is_some() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "pod {name} was not removed within {within:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The tail of every node log, for failure messages.
    fn logs(&self) -> String {
        let mut out = String::new();
        let mut entries: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
            .collect();
        entries.sort_by_key(|e| e.path());
        for e in entries.iter().rev().take(2) {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            out.push_str(&format!("----- {}\n", e.path().display()));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// A small deterministic generator, so a failing sequence can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_sigkills_during_creates_and_deletes_leave_one_instance_per_live_pod() {
    let world = World::new("run-kill").await;
    let config = world.config(free_port());
    let mut rng = Lcg(0x5eed);
    let mut live: Vec<String> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    for i in 0..50 {
        let mut node = world.spawn(&config, &format!("node-{i:02}.log"));
        if i % 2 == 0 {
            let name = format!("p-{i:02}");
            world.create_pod(&name).await;
            live.push(name);
        } else if i % 6 == 3 && live.len() > 2 {
            let name = live.remove(rng.next(live.len() as u64) as usize);
            world
                .pods()
                .delete(&name, &DeleteParams::default())
                .await
                .unwrap();
            deleted.push(name);
        }
        // Leadership takes up to the lease duration after the last kill; then a create or a
        // delete is under way somewhere in this window.
        tokio::time::sleep(Duration::from_millis(1500 + rng.next(2000))).await;
        node.start_kill().unwrap();
        node.wait().await.unwrap();
    }
    let _node = world.spawn(&config, "node-final.log");
    for name in &live {
        world.wait_running(name, Duration::from_secs(120)).await;
    }
    for name in &deleted {
        world.wait_gone(name, Duration::from_secs(60)).await;
    }
    let bindings: Api<CloudPodBinding> =
        Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let mut want = Vec::new();
    for name in &live {
        want.push(bindings.get(name).await.unwrap().spec.external_name);
    }
    let ledger = world.sims.ledger();
    assert!(
        ledger.duplicate_live_names().is_empty(),
        "rented twice: {:?}",
        ledger.duplicate_live_names()
    );
    let mut got: Vec<String> = ledger.live().iter().map(|e| e.name.clone()).collect();
    got.sort();
    want.sort();
    assert_eq!(
        got,
        want,
        "live instances are not exactly one per live pod ({} live, {} deleted)",
        live.len(),
        deleted.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_replica_takes_over_when_the_leader_dies() {
    let world = World::new("run-standby").await;
    let ports = [free_port(), free_port()];
    let mut replicas = [
        Some(world.spawn(&world.config(ports[0]), "replica-0.log")),
        Some(world.spawn(&world.config(ports[1]), "replica-1.log")),
    ];
    world.create_pod("first").await;
    world.wait_running("first", Duration::from_secs(60)).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(world.ctx.client.clone());
    let node = nodes.get(&world.node).await.unwrap();
    let gpus = node.status.unwrap().allocatable.unwrap()["nvidia.com/gpu"]
        .0
        .clone();
    assert_eq!(
        gpus, "64",
        "healthy providers with offers and no budget: the ceiling"
    );
    let leases: Api<Lease> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let holder = leases
        .get(&format!("neocloud-node-{}", world.node))
        .await
        .unwrap()
        .spec
        .unwrap()
        .holder_identity
        .unwrap();
    let leader = replicas
        .iter()
        .position(|r| {
            let pid = r.as_ref().unwrap().id().unwrap();
            holder == format!("{}-{pid}", world.node)
        })
        .unwrap_or_else(|| panic!("no replica holds the lease; holder is {holder}"));
    let standby = 1 - leader;
    // A standby is ready: healthy and able to take over.
    let before = http_get(ports[standby], "/readyz");
    assert!(before.starts_with("HTTP/1.1 200"), "{before}");
    let mut dead = replicas[leader].take().unwrap();
    dead.start_kill().unwrap();
    dead.wait().await.unwrap();

    world.create_pod("second").await;
    world.wait_running("second", Duration::from_secs(60)).await;
    let ready = http_get(ports[standby], "/readyz");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let metrics = http_get(ports[standby], "/metrics");
    assert!(
        metrics.contains("neocloud_rentals_total{") && metrics.contains("outcome=\"created\""),
        "{metrics}"
    );
    // The gauges come from the new leader's caches (refreshed every 5 s): both Pods, the one
    // it took over and the one it placed, are Running on running instances.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = http_get(ports[standby], "/metrics");
        let pods = metrics.contains("neocloud_pods{phase=\"Running\"} 2");
        let instances = metrics.lines().any(|l| {
            l.starts_with("neocloud_instances{")
                && l.contains("phase=\"running\"")
                && l.ends_with(" 2")
        });
        if pods && instances {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "gauges never counted 2 running Pods and instances:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Spend is charged to the Pods' team label, per namespace and provider, and only grows.
    let charged = format!(
        "neocloud_spend_usd_total{{namespace=\"{}\",team=\"vision\",provider=",
        world.ctx.namespace
    );
    let spent = |metrics: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(&charged))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let before = spent(&http_get(ports[standby], "/metrics"));
    assert!(before > 0.0, "{}", http_get(ports[standby], "/metrics"));
    let ledger = world.sims.ledger();
    assert_eq!(ledger.live().len(), 2, "{:?}", ledger.live());
    assert!(ledger.duplicate_live_names().is_empty());
    let _ = world.pods().delete("first", &DeleteParams::default()).await;
    world.wait_gone("first", Duration::from_secs(60)).await;
    assert_eq!(world.sims.ledger().live().len(), 1);
    let after = spent(&http_get(ports[standby], "/metrics"));
    assert!(after >= before, "spend went down from {before} to {after}");
    let pod = world.pods().get("second").await.unwrap();
    assert_eq!(pod.name_any(), "second");
}

/// The three simulators' live spend, USD per hour.
fn live_spend(sims: &CloudSim) -> f64 {
    sims.ledger()
        .live()
        .iter()
        .map(|e| e.price_per_hour)
        .fold(0.0, |a, b| a + b)
}

/// Sleeps `d`, sampling the live spend every 100 ms; returns the highest seen.
async fn sample_spend(sims: &CloudSim, d: Duration) -> f64 {
    let until = tokio::time::Instant::now() + d;
    let mut most = live_spend(sims);
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        most = most.max(live_spend(sims));
    }
    most
}

/// A replica's config for the failover runs: `providers`, a cluster budget of `cap` USD per
/// hour, a 2 s Lease, fast retries, and a sweeper every 2 s with a 4 s grace.
fn budget_config(world: &World, port: u16, providers: &str, cap: f64) -> PathBuf {
    let yaml = format!(
        "clusterId: chaos\n\
         node: {{name: {node}, leaseRenewSeconds: 1, kubeletPort: {kubelet}}}\n\
         providers: {providers}\n\
         installCrds: true\n\
         budgetUsdPerHour: {cap}\n\
         metricsAddress: 127.0.0.1:{port}\n\
         healthIntervalSeconds: 1\n\
         leaderElection: {{namespace: {ns}, leaseDurationSeconds: 2, renewGraceSeconds: 1}}\n\
         reconciler: {{pollIntervalMs: 300, retryIntervalMs: 1000}}\n\
         sweeper: {{intervalSeconds: 2, graceSeconds: 4}}\n",
        node = world.node,
        ns = world.ctx.namespace,
        kubelet = free_port(),
    );
    let path = world.dir.path().join(format!("budget-{port}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_sigkilled_while_rentals_are_in_flight_leaves_the_standby_within_the_budget() {
    const CAP: f64 = 0.8;
    let world = World::new("run-inflight").await;
    // Every create answers after 4 s: the leader is killed with rentals in flight, whose
    // instances the providers create anyway.
    let slow = FaultKind::Slow { delay_ms: 4000 };
    world
        .sims
        .runpod
        .add_fault(FaultRule::next("POST /v2/pods", 8, slow.clone()));
    world
        .sims
        .vast
        .add_fault(FaultRule::next("PUT /api/v0/asks/{id}/", 8, slow));
    let config = |port: u16| budget_config(&world, port, "[runpod, vast]", CAP);
    let mut replicas: Vec<Child> = (0..2)
        .map(|i| world.spawn(&config(free_port()), &format!("inflight-{i}.log")))
        .collect();
    let live: Vec<String> = (0..4).map(|i| format!("f-{i}")).collect();
    for name in &live {
        world.create_pod(name).await;
    }
    let bindings: Api<CloudPodBinding> =
        Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let in_flight = || async {
        // Until a replica has installed the CRD, there is nothing to list.
        let Ok(list) = bindings.list(&Default::default()).await else {
            return false;
        };
        list.items.iter().any(|b| {
            b.status.as_ref().is_some_and(|s| {
                s.attempts
                    .last()
                    .is_some_and(|a| a.outcome == neocloud_node::crd::AttemptOutcome::InFlight)
            })
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut most = 0.0f64;
    while !in_flight().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no rental went in flight:\n{}",
            world.logs()
        );
        most = most.max(sample_spend(&world.sims, Duration::from_millis(100)).await);
    }
    let pid = leader_pid(&world).await.expect("a replica leads");
    let at = replicas
        .iter()
        .position(|r| r.id() == Some(pid))
        .expect("the leader is one of the replicas");
    let mut dead = replicas.remove(at);
    dead.start_kill().unwrap();
    dead.wait().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        most = most.max(sample_spend(&world.sims, Duration::from_millis(500)).await);
        let unsettled = unsettled(&world, &live, &[]).await;
        if unsettled.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled 120 s after the kill:\n{}\n{}",
            unsettled.join("\n"),
            world.logs()
        );
    }
    // Past the sweeper's grace, whatever was rented in flight is either a Pod's or gone.
    most = most.max(sample_spend(&world.sims, Duration::from_secs(8)).await);
    let ledger = world.sims.ledger();
    assert!(
        most <= CAP + 1e-9,
        "spend reached ${most}/h over the ${CAP}/h cap"
    );
    assert!(ledger.duplicate_live_names().is_empty(), "rented twice");
    let mut want = Vec::new();
    for name in &live {
        let b = bindings.get(name).await.unwrap();
        if b.status.and_then(|s| s.instance_id).is_some() {
            want.push(b.spec.external_name);
        }
    }
    let mut got: Vec<String> = ledger.live().iter().map(|e| e.name.clone()).collect();
    got.sort();
    want.sort();
    assert_eq!(
        got, want,
        "live instances are not exactly one per placed Pod"
    );
    assert!(!want.is_empty(), "nothing was placed");
    let log = world.logs();
    assert!(
        log.contains("budget rebuilt from the bindings running="),
        "the standby did not rebuild the budget:\n{log}"
    );
}

/// The live Pods neither Running nor Pending with a reason, and the deleted Pods still there.
async fn unsettled(world: &World, live: &[String], deleted: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for name in live {
        let pod = world.pods().get(name).await.unwrap();
        let status = pod.status.unwrap_or_default();
        let ok = match status.phase.as_deref() {
            Some("Running") => true,
            Some("Pending") => matches!(status.reason.as_deref(), Some("OverBudget" | "NoOffer")),
            _ => false,
        };
        if !ok {
            out.push(format!(
                "{name}: {:?} {:?} {:?}",
                status.phase, status.reason, status.message
            ));
        }
    }
    for name in deleted {
        if world.pods().get_opt(name).await.unwrap().is_some() {
            out.push(format!("{name}: deleted but still there"));
        }
    }
    out
}

/// The pid of the replica holding the node's Lease, if one does.
async fn leader_pid(world: &World) -> Option<u32> {
    let leases: Api<Lease> = Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let lease = leases
        .get_opt(&format!("neocloud-node-{}", world.node))
        .await
        .ok()??;
    let holder = lease.spec?.holder_identity?;
    holder
        .strip_prefix(&format!("{}-", world.node))?
        .parse()
        .ok()
}

/// Arms one fault of the ones a cloud throws at creates, on a random simulator.
fn arm_fault(world: &World, rng: &mut Lcg) -> &'static str {
    let kinds = [
        ("capacity", FaultKind::CapacityExhausted),
        (
            "429",
            FaultKind::RateLimited {
                retry_after_secs: 1,
            },
        ),
        ("5xx", FaultKind::ServerError { status: 503 }),
        ("lost response", FaultKind::LostResponse),
        ("slow", FaultKind::Slow { delay_ms: 1500 }),
    ];
    let (label, kind) = kinds[rng.next(kinds.len() as u64) as usize].clone();
    let rule = |route| FaultRule::next(route, 1, kind.clone());
    match rng.next(3) {
        0 => world.sims.runpod.add_fault(rule("POST /v2/pods")),
        1 => world.sims.vast.add_fault(rule("PUT /api/v0/asks/{id}/")),
        _ => world
            .sims
            .lambda
            .add_fault(rule("POST /api/v1/instance-operations/launch")),
    };
    label
}

/// How many SIGKILLs the chaos run deals: `NEOCLOUD_CHAOS_KILLS`, 20 by default (the short form
/// `make verify` runs; docs/BENCHMARKS.md records a run of 200).
fn chaos_kills() -> u32 {
    std::env::var("NEOCLOUD_CHAOS_KILLS")
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("NEOCLOUD_CHAOS_KILLS: {v:?} is not a count"))
        })
        .unwrap_or(20)
}

#[tokio::test(flavor = "multi_thread")]
async fn chaos_leaders_killed_at_random_under_faults_and_a_budget_keep_every_promise() {
    const CAP: f64 = 1.5;
    let world = World::new("run-chaos").await;
    let kills = chaos_kills();
    let config = |port: u16| budget_config(&world, port, "[runpod, vast, lambda]", CAP);
    let mut rng = Lcg(0xc4a05);
    let mut replicas: Vec<Child> = (0..2)
        .map(|i| world.spawn(&config(free_port()), &format!("chaos-start-{i}.log")))
        .collect();
    let (mut live, mut deleted) = (Vec::<String>::new(), Vec::<String>::new());
    let (mut faults, mut most, mut created) = (0u32, 0.0f64, 0u32);
    for i in 0..kills {
        if rng.next(3) > 0 || live.len() < 2 {
            let name = format!("c-{i:03}");
            world.create_pod(&name).await;
            live.push(name);
            created += 1;
        } else {
            let name = live.remove(rng.next(live.len() as u64) as usize);
            let _ = world.pods().delete(&name, &DeleteParams::default()).await;
            deleted.push(name);
        }
        for _ in 0..2 {
            arm_fault(&world, &mut rng);
            faults += 1;
        }
        // A leader takes up to the lease term to step in; then something is under way.
        let wait = Duration::from_millis(1500 + rng.next(2500));
        most = most.max(sample_spend(&world.sims, wait).await);
        if let Some(pid) = leader_pid(&world).await
            && let Some(at) = replicas.iter().position(|r| r.id() == Some(pid))
        {
            let mut dead = replicas.remove(at);
            dead.start_kill().unwrap();
            dead.wait().await.unwrap();
            replicas.push(world.spawn(&config(free_port()), &format!("chaos-{i:03}.log")));
        }
    }
    let last_kill = tokio::time::Instant::now();
    world.sims.runpod.clear_faults();
    world.sims.vast.clear_faults();
    world.sims.lambda.clear_faults();
    // Converged: every live Pod Running, or Pending with a reason; every deleted Pod gone.
    let deadline = last_kill + Duration::from_secs(240);
    loop {
        most = most.max(live_spend(&world.sims));
        let unsettled = unsettled(&world, &live, &deleted).await;
        if unsettled.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not converged 240 s after the last kill:\n{}\n{}",
            unsettled.join("\n"),
            world.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let converged = last_kill.elapsed();
    // One sweep (2 s) past the grace (4 s) removes anything no binding explains.
    most = most.max(sample_spend(&world.sims, Duration::from_secs(8)).await);
    let bindings: Api<CloudPodBinding> =
        Api::namespaced(world.ctx.client.clone(), &world.ctx.namespace);
    let mut want = Vec::new();
    for name in &live {
        let b = bindings.get(name).await.unwrap();
        if b.status.and_then(|s| s.instance_id).is_some() {
            want.push(b.spec.external_name);
        }
    }
    let ledger = world.sims.ledger();
    let mut got: Vec<String> = ledger.live().iter().map(|e| e.name.clone()).collect();
    got.sort();
    want.sort();
    let rentals = ledger.entries.len();
    println!(
        "chaos: {kills} SIGKILLs survived, {created} Pods created, {} deleted, {faults} faults \
         armed, {rentals} rentals, {} live; highest spend ${most:.4}/h of ${CAP}/h; converged \
         {:.1} s after the last kill",
        deleted.len(),
        got.len(),
        converged.as_secs_f64()
    );
    assert!(
        most <= CAP + 1e-9,
        "spend reached ${most}/h over the ${CAP}/h cap"
    );
    assert!(
        ledger.duplicate_live_names().is_empty(),
        "rented twice: {got:?}"
    );
    assert_eq!(
        got, want,
        "live instances are not exactly one per placed live Pod"
    );
    assert!(!want.is_empty(), "no Pod was ever placed");
}
