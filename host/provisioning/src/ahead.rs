//! Renting ahead: once a request's budget is held (see `decide`), every one of its Pods gets a
//! machine rented now, in the place it was planned in, with a runner that waits for the Pod
//! (see `neocloud_controller::reconcile::held`). All or none: a machine that cannot be rented,
//! or whose runner does not come up within the boot timeout, fails the request and releases
//! every machine rented for it. Only where the node's runner runs the request's Pods (a VM
//! provider, or a container provider for a Pod that names its command): elsewhere a machine
//! would start the workload before its Pod came, and the request holds budget only.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use neocloud_broker::Planner;
use neocloud_controller::holds::{HeldMachine, HeldPlace};
use neocloud_controller::reconcile::{Held, HeldFor};
use neocloud_core::WorkloadSpec;

use super::controller::Provisioner;
use super::decide::Outcome;
use super::regions::Place;
use super::types::ProvisioningRequest;

/// How often the held machines' runners are looked at while the request waits for them.
const UP_POLL: Duration = Duration::from_millis(250);

/// One pod set to rent ahead: a Pod like its template's, translated and planned.
pub(super) struct AheadSet {
    pub pod: Pod,
    pub count: u32,
    pub workload: WorkloadSpec,
    pub planner: Planner,
}

impl Provisioner {
    /// Whether `req`'s Pods get machines rented ahead in `place`.
    pub(super) fn rents_ahead(&self, sets: &[AheadSet], place: &Place) -> bool {
        let runs = |set: &AheadSet| self.reconciler.runner_runs(place.provider, &set.pod);
        self.cfg.rent_ahead && sets.iter().all(runs)
    }

    /// Rents a machine for every Pod of `req` in `place` (its budget held already) and waits
    /// for their runners; a failure releases them all and is the request's outcome.
    pub(super) async fn rent_ahead(
        &self,
        req: &ProvisioningRequest,
        sets: &[AheadSet],
        place: &Place,
    ) -> kube::Result<Result<Vec<HeldMachine>, Outcome>> {
        let key = super::key(req);
        let held_for = HeldFor {
            namespace: req.namespace().unwrap_or_default(),
            name: req.name_any(),
            uid: req.uid().unwrap_or_default(),
            owner: OwnerReference {
                api_version: "autoscaling.x-k8s.io/v1".into(),
                kind: "ProvisioningRequest".into(),
                name: req.name_any(),
                uid: req.uid().unwrap_or_default(),
                ..OwnerReference::default()
            },
        };
        let total: u32 = sets.iter().map(|s| s.count).sum();
        let held_place = HeldPlace {
            provider: place.provider,
            region: place.region.clone(),
        };
        let mut rented: Vec<HeldMachine> = Vec::new();
        let mut n = 0;
        for set in sets {
            for _ in 0..set.count {
                // The machine reserves its own budget: the hold gives up one reservation first.
                self.holds.drop_one(&key);
                let planned = (set.workload.clone(), set.planner.clone());
                let held = self
                    .reconciler
                    .rent_held(&held_for, n, &set.pod, planned, held_place.clone())
                    .await
                    .map_err(controller_error)?;
                match held {
                    Held::Rented(machine) => {
                        let kept = self.holds.add_machine(&key, &held_for.uid, machine.clone());
                        rented.push(machine);
                        if !kept {
                            let why = "the request was released while its machines were rented";
                            return self.unrent(&rented, "Released", why.into()).await;
                        }
                    }
                    Held::Failed(reason, why) => {
                        let message = format!(
                            "machine {} of {total} could not be rented on {}: {why}",
                            n + 1,
                            place.describe()
                        );
                        return self.unrent(&rented, &reason, message).await;
                    }
                }
                n += 1;
            }
        }
        self.wait_up(&rented, place).await
    }

    /// Waits until every machine's runner has called in, for the runners' boot timeout.
    async fn wait_up(
        &self,
        rented: &[HeldMachine],
        place: &Place,
    ) -> kube::Result<Result<Vec<HeldMachine>, Outcome>> {
        let boot = self.reconciler.runner_boot_timeout();
        let deadline = Instant::now() + boot;
        loop {
            if let Some(lost) = rented.iter().find(|m| self.reconciler.held_lost(&m.slot)) {
                let message = format!(
                    "the runner of {} {} on {} was lost before the pods came",
                    lost.provider,
                    lost.instance_id,
                    place.describe()
                );
                return self.unrent(rented, "CapacityRevoked", message).await;
            }
            let up = rented
                .iter()
                .filter(|m| self.reconciler.held_up(&m.slot))
                .count();
            if up == rented.len() {
                return Ok(Ok(rented.to_vec()));
            }
            if Instant::now() >= deadline {
                let message = format!(
                    "{up} of {} machines on {} were up within the runner's boot timeout of {}s",
                    rented.len(),
                    place.describe(),
                    boot.as_secs()
                );
                return self.unrent(rented, "RunnerNotUp", message).await;
            }
            tokio::time::sleep(UP_POLL).await;
        }
    }

    /// Releases every machine of `rented` (their bindings are deleted; the binding controller
    /// releases the instances) and says why the request failed.
    async fn unrent(
        &self,
        rented: &[HeldMachine],
        reason: &str,
        message: String,
    ) -> kube::Result<Result<Vec<HeldMachine>, Outcome>> {
        for machine in rented {
            self.reconciler
                .delete_held_named(&machine.namespace, &machine.binding)
                .await
                .map_err(controller_error)?;
        }
        let message = match rented.len() {
            0 => format!("{message}; nothing was rented"),
            1 => format!("{message}; the machine rented for it is released"),
            n => format!("{message}; the {n} machines rented for it are released"),
        };
        Ok(Err(Outcome::Failed {
            reason: reason.to_owned(),
            message,
        }))
    }
}

/// The controller's error as the API server's (which it is, or a bad object).
fn controller_error(e: neocloud_controller::reconcile::Error) -> kube::Error {
    match e {
        neocloud_controller::reconcile::Error::Kube(e) => e,
        other => kube::Error::Service(other.to_string().into()),
    }
}
