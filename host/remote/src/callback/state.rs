//! The callback's state: registered (or, after a restart, adopted) bindings with their current
//! rental, workload, log, last known runner state and liveness, the token stores, and the
//! heartbeat monitor that reports silent runners as `Lost`.
//!
//! A binding's rental is its runner generation: the node takes the next one each time it boots
//! a runner for the binding (and keeps it in the binding's status, so a new leader adopts the
//! same). Every call of a runner names its rental (its session, bootstrap token or credential
//! does), and one of a rental that is no longer current, because it was replaced or its runner
//! declared lost, is refused as [`RentalNotCurrent`](CallbackError::RentalNotCurrent) before it
//! touches anything: the runner of an old machine that comes back changes nothing of the new one.
//!
//! Not HTTP: the server's handlers call these methods with the uid and rental a session token
//! proved.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::BoxStream;
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::credential::{CredentialKind, Verified};
use super::logs::{LogBuffer, LogLine, LogOptions};
use super::ratelimit::Limiter;
use super::runner::{InPlace, Runner, RunnerStatus};
use super::sessions::Sessions;
use super::tokens::{
    BootstrapToken, BootstrapTokens, IssuedSession, Secret, SessionSigner, unix_now,
};
use super::{CallbackConfig, CallbackError, RunnerEvent, RunnerEventKind};
use super::{Handover, LogRecord, RunnerState, StatusReport, Workload};

#[derive(Debug)]
struct Entry {
    /// The current rental: only its runner is believed.
    rental: u64,
    workload: Workload,
    logs: Arc<LogBuffer>,
    /// Set when the runner first authenticates, refreshed by heartbeats and reports.
    last_seen: Option<Instant>,
    /// What the node knows of the rental's runner (the one place it is kept).
    runner: Runner,
    /// Adopted after a restart, and its runner has not called in since.
    awaited: bool,
    /// The rental's runner has made a call with a session: its boot credential is spent.
    called_in: bool,
    /// What the workload used when the runner last said.
    stats: Option<neocloud_protocol::WorkloadStats>,
    /// Its egress connections open (see `super::egress`).
    egress_open: Arc<std::sync::atomic::AtomicUsize>,
    /// A machine rented ahead of its Pod: no workload, and its runner waits for [`Handover`].
    held: bool,
    /// The binding of the Pod that took the held machine, and its secrets, once one did.
    handover: Option<(String, Handover)>,
    /// The held machine's runner has been given its handover.
    handed: bool,
}

impl Entry {
    fn new(rental: u64, workload: Workload, logs: LogBuffer) -> Self {
        Self {
            rental,
            workload,
            logs: Arc::new(logs),
            last_seen: None,
            runner: Runner::default(),
            awaited: false,
            called_in: false,
            stats: None,
            egress_open: Arc::default(),
            held: false,
            handover: None,
            handed: false,
        }
    }
}

/// What the node knows of a machine held for a Pod (see [`CallbackHandle::register_held`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldRunner {
    /// Its runner has called in: the machine is up and waits for a Pod.
    pub called_in: bool,
    /// Its runner went silent past the heartbeat timeout (the machine is gone or cut off).
    pub lost: bool,
    /// A Pod took it, and its runner has fetched the Pod's secrets.
    pub handed: bool,
}

/// Shared state of one callback server.
#[derive(Debug)]
pub(crate) struct State {
    pub config: CallbackConfig,
    bootstrap: BootstrapTokens,
    signer: SessionSigner,
    bindings: Mutex<HashMap<String, Entry>>,
    events: mpsc::Sender<RunnerEvent>,
    pub token_limiter: Limiter<IpAddr>,
    pub request_limiter: Limiter<String>,
    started: Instant,
    /// Bindings unregistered within the adoption window: gone, not waiting to be adopted.
    forgotten: Mutex<HashSet<String>>,
    /// Set when the server shuts down, so open log streams end instead of holding it up.
    pub closing: tokio::sync::watch::Sender<bool>,
    /// Sessions offered to runners and not yet dialled back.
    pub sessions: Sessions,
}

/// What the node holds to register workloads and read logs; cheap to clone.
#[derive(Debug, Clone)]
pub struct CallbackHandle(pub(crate) Arc<State>);

impl CallbackHandle {
    /// Registers rental `rental` of a binding with its workload and returns a fresh one-time
    /// bootstrap token for its `user_data`. Re-registering replaces the workload, invalidates
    /// the previous bootstrap token, starts an empty log and clears `Lost`; with another rental,
    /// the earlier rental's runner is refused from then on (its sessions, credentials and
    /// waiting session offers are void).
    pub fn register(
        &self,
        uid: &str,
        rental: u64,
        workload: Workload,
    ) -> Result<BootstrapToken, CallbackError> {
        self.insert(uid, rental, workload, false)
    }

    /// Registers rental `rental` of a machine rented ahead of its Pod (held for a
    /// ProvisioningRequest; `uid` names the held binding) and returns its bootstrap token. Its
    /// runner authenticates and is told there is no workload ([`CallbackError::HeldForAPod`]);
    /// it then waits on `GET /v1/handover`, each poll a sign of life, until
    /// [`CallbackHandle::hand_over`] gives the machine to a Pod.
    pub fn register_held(&self, uid: &str, rental: u64) -> Result<BootstrapToken, CallbackError> {
        self.insert(uid, rental, Workload::default(), true)
    }

    fn insert(
        &self,
        uid: &str,
        rental: u64,
        workload: Workload,
        held: bool,
    ) -> Result<BootstrapToken, CallbackError> {
        let token = self.0.bootstrap.issue(uid, rental)?;
        let mut entry = Entry::new(rental, workload, LogBuffer::new(self.0.config.log_limits));
        entry.held = held;
        let old = self.0.bindings.lock().insert(uid.to_string(), entry);
        if let Some(old) = old {
            old.logs.close();
            if old.rental != rental {
                self.0
                    .sessions
                    .retire(uid, rental, || CallbackError::RunnerGone {
                        uid: uid.to_owned(),
                        how: "been replaced by another rental",
                    });
            }
        }
        tracing::debug!(
            binding = uid,
            rental,
            held,
            "callback: registered a workload"
        );
        Ok(token)
    }

    /// Gives the held machine `held` (see [`CallbackHandle::register_held`]) to the Pod whose
    /// binding is `uid`: registers rental `rental` of that binding with `workload`, and hands
    /// the machine's runner that rental's bootstrap token and boot credential at its next poll.
    /// The runner then authenticates as the Pod's and runs its workload. Handing the machine to
    /// the same Pod again (a new leader) issues fresh secrets; to another Pod, or a machine
    /// whose runner was lost, is refused and registers nothing.
    pub fn hand_over(
        &self,
        held: &str,
        uid: &str,
        rental: u64,
        workload: Workload,
    ) -> Result<(), CallbackError> {
        let refused = |why| CallbackError::NotHeld {
            uid: held.to_owned(),
            why,
        };
        let check = |entry: Option<&Entry>| -> Result<(), CallbackError> {
            let entry = entry.ok_or_else(|| CallbackError::NotRegistered(held.to_owned()))?;
            if !entry.held {
                return Err(refused("it is not a machine held for a Pod"));
            }
            if entry.runner.lost {
                return Err(refused("its runner was declared lost"));
            }
            Ok(())
        };
        let check = |entry: Option<&Entry>| {
            check(entry)?;
            match entry.and_then(|e| e.handover.as_ref()) {
                Some((taker, _)) if taker != uid => Err(refused("another Pod took it")),
                _ => Ok(()),
            }
        };
        check(self.0.bindings.lock().get(held))?;
        let token = self.insert(uid, rental, workload, false)?;
        let credential = self.credential(uid, rental)?;
        let mut bindings = self.0.bindings.lock();
        if let Err(e) = check(bindings.get(held)) {
            drop(bindings);
            self.unregister(uid);
            return Err(e);
        }
        if let Some(entry) = bindings.get_mut(held) {
            let handover = Handover {
                bootstrap_token: Some(token.expose().to_owned()),
                credential: Some(credential.expose().to_owned()),
            };
            entry.handover = Some((uid.to_owned(), handover));
        }
        tracing::info!(
            held,
            binding = uid,
            rental,
            "callback: a held machine is handed over"
        );
        Ok(())
    }

    /// What the node knows of the held machine `uid`; `None` when it is not one.
    pub fn held(&self, uid: &str) -> Option<HeldRunner> {
        let bindings = self.0.bindings.lock();
        let entry = bindings.get(uid).filter(|e| e.held)?;
        Some(HeldRunner {
            called_in: entry.called_in,
            lost: entry.runner.lost,
            handed: entry.handed,
        })
    }

    /// Takes over the held machine `uid` (rental `rental`) that an earlier process registered
    /// (see [`CallbackHandle::adopt`]): its runner has the boot timeout, or, if it had called
    /// in, the heartbeat timeout from now to poll again. Returns false, changing nothing, if
    /// it is already registered here.
    pub fn adopt_held(&self, uid: &str, rental: u64, called_in: bool) -> bool {
        let mut bindings = self.0.bindings.lock();
        if bindings.contains_key(uid) {
            return false;
        }
        let mut entry = Entry::new(
            rental,
            Workload::default(),
            LogBuffer::new(self.0.config.log_limits),
        );
        entry.held = true;
        entry.last_seen = called_in.then(Instant::now);
        entry.called_in = called_in;
        entry.awaited = true;
        bindings.insert(uid.to_string(), entry);
        tracing::info!(binding = uid, rental, "callback: adopted a held machine");
        true
    }

    /// The boot credential of rental `rental` of a binding, for its `user_data`: any replica
    /// sharing this node's keys accepts it as long as the bootstrap token lives, while the
    /// rental is current and until its runner has called in (then it is spent).
    pub fn credential(&self, uid: &str, rental: u64) -> Result<Secret, CallbackError> {
        let config = &self.0.config;
        let not_after = unix_now() + config.bootstrap_ttl.as_secs() as i64;
        let kind = CredentialKind::Boot;
        Ok(config
            .keys
            .credential(&config.trust_domain, uid, rental, kind, not_after)?)
    }

    /// Takes over rental `rental` of a binding registered by an earlier process (this one has
    /// no bootstrap token for it). With `state` (the runner had reported it, as the Pod shows)
    /// the runner has the heartbeat timeout from now to call in before it is `Lost`, and its
    /// boot credential is spent; without, it is booting and the node's boot timeout applies
    /// from now. `probes` is what the Pod showed of them, kept until its runner says.
    /// Returns false, changing nothing, if the binding is already registered here.
    pub fn adopt(
        &self,
        uid: &str,
        rental: u64,
        workload: Workload,
        state: Option<RunnerState>,
        probes: Option<neocloud_protocol::ProbeStatus>,
    ) -> bool {
        let mut bindings = self.0.bindings.lock();
        if bindings.contains_key(uid) {
            return false;
        }
        let mut entry = Entry::new(rental, workload, LogBuffer::new(self.0.config.log_limits));
        entry.runner = Runner::adopted(state, probes);
        entry.last_seen = state.map(|_| Instant::now());
        entry.called_in = state.is_some();
        entry.awaited = true;
        bindings.insert(uid.to_string(), entry);
        tracing::info!(binding = uid, rental, ?state, "callback: adopted a binding");
        true
    }

    /// Replaces the files of rental `rental`'s workload (a ConfigMap or Secret it mounts
    /// changed); its runner fetches them at its next refresh. Returns whether anything changed
    /// (false for another rental or an unknown binding).
    pub fn set_files(
        &self,
        uid: &str,
        rental: u64,
        files: Vec<neocloud_protocol::FileMount>,
    ) -> bool {
        let mut bindings = self.0.bindings.lock();
        match bindings.get_mut(uid) {
            Some(entry) if entry.rental == rental && entry.workload.files != files => {
                entry.workload.files = files;
                true
            }
            _ => false,
        }
    }

    /// Forgets a binding: its bootstrap token and sessions stop working and followers of its
    /// log finish. Idempotent.
    pub fn unregister(&self, uid: &str) {
        self.0.bootstrap.revoke(uid);
        if self.0.adopting() {
            self.0.forgotten.lock().insert(uid.to_string());
        }
        if let Some(old) = self.0.bindings.lock().remove(uid) {
            old.logs.close();
        }
        self.0.sessions.forget(uid);
    }

    /// The binding's log as the kubelet's `/containerLogs` would serve it: the current run's,
    /// or with `options.previous` the last run that ended before a restart in place
    /// ([`CallbackError::NoPreviousRun`] when there is none).
    pub fn read_logs(
        &self,
        uid: &str,
        options: LogOptions,
    ) -> Result<BoxStream<'static, Bytes>, CallbackError> {
        self.0
            .logs(uid)?
            .read(options)
            .ok_or_else(|| CallbackError::NoPreviousRun(uid.to_owned()))
    }

    /// Whether the binding is registered (or adopted) here.
    pub fn is_registered(&self, uid: &str) -> bool {
        self.0.bindings.lock().contains_key(uid)
    }

    /// What the node makes of the binding's runner (`None` when it is not registered here).
    /// The first ask starts its boot timeout: ask once its instance exists.
    pub fn runner_status(&self, uid: &str, boot_timeout: Duration) -> Option<RunnerStatus> {
        let mut bindings = self.0.bindings.lock();
        Some(bindings.get_mut(uid)?.runner.status(boot_timeout))
    }

    /// What the binding's runner last said of its restarts in place.
    pub fn in_place(&self, uid: &str) -> InPlace {
        let bindings = self.0.bindings.lock();
        bindings
            .get(uid)
            .map(|e| e.runner.in_place())
            .unwrap_or_default()
    }

    /// What the binding's probes last said (its container's `ready` and `started`); `None`
    /// when its runner runs none or has not said yet.
    pub fn probes(&self, uid: &str) -> Option<neocloud_protocol::ProbeStatus> {
        self.0.bindings.lock().get(uid)?.runner.probes()
    }

    /// The notes of the binding's failed checks since the last call, for its `Unhealthy`
    /// events.
    pub fn take_unhealthy(&self, uid: &str) -> Vec<String> {
        let mut bindings = self.0.bindings.lock();
        (bindings.get_mut(uid))
            .map(|e| e.runner.take_unhealthy())
            .unwrap_or_default()
    }

    /// What the binding's workload used when its runner last said, if it has.
    pub fn stats(&self, uid: &str) -> Option<neocloud_protocol::WorkloadStats> {
        self.0.bindings.lock().get(uid)?.stats.clone()
    }

    /// Every stored log line of a binding, with its stream.
    pub fn log_lines(&self, uid: &str) -> Result<Vec<LogLine>, CallbackError> {
        Ok(self.0.logs(uid)?.lines())
    }
}

impl State {
    pub fn new(
        config: CallbackConfig,
        events: mpsc::Sender<RunnerEvent>,
    ) -> Result<Self, CallbackError> {
        Ok(Self {
            bootstrap: BootstrapTokens::new(config.bootstrap_ttl),
            signer: SessionSigner::with_key(
                config.keys.session_key(),
                &config.trust_domain,
                config.session_ttl,
            )?,
            bindings: Mutex::new(HashMap::new()),
            events,
            token_limiter: Limiter::new(config.token_rate_per_ip),
            request_limiter: Limiter::new(config.request_rate_per_binding),
            started: Instant::now(),
            forgotten: Mutex::new(HashSet::new()),
            closing: tokio::sync::watch::Sender::new(false),
            sessions: Sessions::default(),
            config,
        })
    }

    /// Whether the adoption window after start is still open.
    fn adopting(&self) -> bool {
        self.started.elapsed() < self.config.adoption_window
    }

    fn logs(&self, uid: &str) -> Result<Arc<LogBuffer>, CallbackError> {
        let bindings = self.bindings.lock();
        let entry = bindings
            .get(uid)
            .ok_or_else(|| CallbackError::NotRegistered(uid.to_string()))?;
        Ok(entry.logs.clone())
    }

    /// Exchanges a bootstrap token for a session; its rental must still be current.
    pub fn exchange(&self, bootstrap: &str) -> Result<IssuedSession, CallbackError> {
        let (uid, rental) = self.bootstrap.consume(bootstrap)?;
        let mut bindings = self.bindings.lock();
        let entry = current(&mut bindings, &uid, rental)?;
        entry.last_seen = Some(Instant::now());
        Ok(self.signer.issue(&uid, rental))
    }

    /// Issues a fresh session for a rental whose current session is still valid.
    pub fn refresh(&self, uid: &str, rental: u64) -> IssuedSession {
        self.signer.issue(uid, rental)
    }

    /// The renewal credential handed out with `session`: it lets the runner get a new session
    /// from any replica for [`renewal_ttl`](super::CallbackConfig::renewal_ttl), while its
    /// rental is current.
    pub fn renewal(&self, uid: &str, rental: u64) -> Option<Secret> {
        let config = &self.config;
        let not_after = unix_now() + config.renewal_ttl.as_secs() as i64;
        let kind = CredentialKind::Renewal;
        let made = config
            .keys
            .credential(&config.trust_domain, uid, rental, kind, not_after);
        made.ok()
    }

    /// Exchanges a re-authentication credential for a session: its rental must be registered
    /// (or adopted) and current, and a boot credential not spent (the rental's runner has not
    /// called in yet).
    pub fn reauthenticate(&self, credential: &str) -> Result<IssuedSession, CallbackError> {
        let config = &self.config;
        let verified = config
            .keys
            .verify(&config.trust_domain, credential, unix_now())?;
        let Verified { uid, rental, kind } = verified;
        self.live(&uid, rental)?;
        let mut bindings = self.bindings.lock();
        let entry = current(&mut bindings, &uid, rental)?;
        if kind == CredentialKind::Boot && entry.called_in {
            return Err(CallbackError::CredentialSpent { uid, rental });
        }
        entry.last_seen = Some(Instant::now());
        Ok(self.signer.issue(&uid, rental))
    }

    /// The binding and rental a session token names, if that rental is current (registered,
    /// not replaced, its runner not lost).
    pub fn authenticate(&self, session: &str) -> Result<(String, u64), CallbackError> {
        let (uid, rental) = self.signer.verify(session)?;
        self.live(&uid, rental)?;
        Ok((uid, rental))
    }

    /// Whether rental `rental` of `uid` is current. An unknown binding is
    /// [`NotAdoptedYet`](CallbackError::NotAdoptedYet) within the adoption window.
    fn live(&self, uid: &str, rental: u64) -> Result<(), CallbackError> {
        let mut bindings = self.bindings.lock();
        match current(&mut bindings, uid, rental) {
            Err(CallbackError::NotRegistered(uid))
                if self.adopting() && !self.forgotten.lock().contains(&uid) =>
            {
                Err(CallbackError::NotAdoptedYet(uid))
            }
            other => other.map(|_| ()),
        }
    }

    /// Whether a session may be offered to `uid`'s runner: registered, and neither exited nor
    /// lost. Returns the current rental, whose runner alone may take the offer.
    pub fn can_open_session(&self, uid: &str) -> Result<u64, CallbackError> {
        let bindings = self.bindings.lock();
        let entry = bindings
            .get(uid)
            .ok_or_else(|| CallbackError::NotRegistered(uid.to_owned()))?;
        let gone = |how| CallbackError::RunnerGone {
            uid: uid.to_owned(),
            how,
        };
        if entry.runner.exited {
            Err(gone("exited"))
        } else if entry.runner.lost {
            Err(gone("been declared lost"))
        } else {
            Ok(entry.rental)
        }
    }

    /// The destination at `index` of rental `rental`'s egress list (`None` when it names no
    /// such one, with how many it names) and its count of open egress connections.
    pub(crate) fn egress(
        &self,
        uid: &str,
        rental: u64,
        index: usize,
    ) -> Result<super::egress::Named, CallbackError> {
        self.touch(uid, rental, |entry| super::egress::Named {
            target: entry.workload.egress.get(index).cloned(),
            count: entry.workload.egress.len(),
            open: entry.egress_open.clone(),
        })
    }

    /// The workload of rental `rental`; [`CallbackError::HeldForAPod`] for a held machine.
    pub fn workload(&self, uid: &str, rental: u64) -> Result<Workload, CallbackError> {
        let held = |entry: &mut Entry| {
            (!entry.held)
                .then(|| entry.workload.clone())
                .ok_or_else(|| CallbackError::HeldForAPod(uid.to_owned()))
        };
        self.touch(uid, rental, held)?
    }

    /// The handover of the held machine `uid` (empty until a Pod takes it); a sign of life.
    pub fn handover(&self, uid: &str, rental: u64) -> Result<Handover, CallbackError> {
        let handover = |entry: &mut Entry| {
            if !entry.held {
                return Err(CallbackError::NotHeld {
                    uid: uid.to_owned(),
                    why: "it is not a machine held for a Pod",
                });
            }
            let handover = (entry.handover.as_ref())
                .map(|(_, h)| h.clone())
                .unwrap_or_default();
            entry.handed |= handover.bootstrap_token.is_some();
            Ok(handover)
        };
        self.touch(uid, rental, handover)?
    }

    /// A usage sample from the runner (also a sign of life).
    pub fn record_stats(
        &self,
        uid: &str,
        rental: u64,
        stats: neocloud_protocol::WorkloadStats,
    ) -> Result<(), CallbackError> {
        self.touch(uid, rental, |entry| entry.stats = Some(stats))
    }

    /// A sign of life; a `state` further along than the one known (a node that took over knows
    /// none) is reported as if the runner had sent it.
    pub async fn heartbeat(
        &self,
        uid: &str,
        rental: u64,
        state: Option<RunnerState>,
    ) -> Result<(), CallbackError> {
        // `BackOff` says too little without its report (how the run ended), which follows.
        let told = |s: RunnerState| !matches!(s, RunnerState::Exited | RunnerState::BackOff);
        let news = self.touch(uid, rental, |entry| match state {
            Some(s) if told(s) && rank(Some(s)) > rank(entry.runner.state) => {
                let report = StatusReport {
                    message: Some("told with a heartbeat".into()),
                    ..StatusReport::new(s)
                };
                entry.runner.record(&report);
                Some(report)
            }
            _ => None,
        })?;
        if let Some(report) = news {
            self.emit(uid, rental, RunnerEventKind::State(report)).await;
        }
        Ok(())
    }

    /// A state report. A repeat of the state already known (a runner retrying a report whose
    /// answer it lost, as across a leader change) is a sign of life and no news, unless it says
    /// what the probes found. A restart in
    /// place moves the log on to a new run (`Running` with a higher restart count), and a run
    /// that ended waiting for its restart (`BackOff`) becomes the previous one.
    pub async fn report(
        &self,
        uid: &str,
        rental: u64,
        report: StatusReport,
    ) -> Result<(), CallbackError> {
        let exited = report.state == RunnerState::Exited;
        let (logs, repeat) = self.touch(uid, rental, |entry| {
            let repeat = entry.runner.repeats(&report);
            if !repeat {
                entry.runner.record(&report);
            }
            (entry.logs.clone(), repeat)
        })?;
        match report.state {
            RunnerState::Running => logs.start_run(report.restart_count),
            RunnerState::BackOff => logs.end_run(report.restart_count),
            RunnerState::Starting | RunnerState::Exited => {}
        }
        if exited {
            logs.close();
            self.sessions.fail(uid, || CallbackError::RunnerGone {
                uid: uid.to_owned(),
                how: "exited",
            });
        }
        if repeat {
            tracing::debug!(binding = uid, state = ?report.state, "callback: a repeated report");
            return Ok(());
        }
        self.emit(uid, rental, RunnerEventKind::State(report)).await;
        Ok(())
    }

    /// Appends a log record of rental `rental`'s runner.
    pub fn append_log(
        &self,
        uid: &str,
        rental: u64,
        record: LogRecord,
    ) -> Result<(), CallbackError> {
        let logs = current(&mut self.bindings.lock(), uid, rental)?
            .logs
            .clone();
        logs.append(record);
        Ok(())
    }

    /// Runs `f` on the entry of a call of rental `rental`'s runner, if that rental is current;
    /// the call is a sign of life and spends the rental's boot credential.
    fn touch<T>(
        &self,
        uid: &str,
        rental: u64,
        f: impl FnOnce(&mut Entry) -> T,
    ) -> Result<T, CallbackError> {
        let mut bindings = self.bindings.lock();
        let entry = current(&mut bindings, uid, rental)?;
        entry.last_seen = Some(Instant::now());
        entry.called_in = true;
        if std::mem::take(&mut entry.awaited) {
            tracing::info!(
                binding = uid,
                "callback: the runner of an adopted binding called in"
            );
        }
        Ok(f(entry))
    }

    async fn emit(&self, uid: &str, rental: u64, kind: RunnerEventKind) {
        let event = RunnerEvent {
            uid: uid.to_string(),
            rental,
            kind,
        };
        if self.events.send(event).await.is_err() {
            tracing::debug!(binding = uid, "callback: nobody listens to runner events");
        }
    }

    /// Marks silent runners lost and returns their uids and rentals.
    fn sweep_silent(&self, now: Instant) -> Vec<(String, u64)> {
        let timeout = self.config.heartbeat_timeout;
        let mut bindings = self.bindings.lock();
        let mut lost = Vec::new();
        for (uid, entry) in bindings.iter_mut() {
            let silent = entry
                .last_seen
                .is_some_and(|seen| now.saturating_duration_since(seen) >= timeout);
            if silent && !entry.runner.lost && !entry.runner.exited {
                entry.runner.lost = true;
                entry.logs.close();
                lost.push((uid.clone(), entry.rental));
            }
        }
        lost
    }
}

/// The entry of `uid` if `rental` is its current rental and its runner not lost.
fn current<'a>(
    bindings: &'a mut HashMap<String, Entry>,
    uid: &str,
    rental: u64,
) -> Result<&'a mut Entry, CallbackError> {
    let entry = bindings
        .get_mut(uid)
        .ok_or_else(|| CallbackError::NotRegistered(uid.to_string()))?;
    let why = if entry.rental != rental {
        format!("the binding's current rental is {}", entry.rental)
    } else if entry.runner.lost {
        "its runner was declared lost (silent past the heartbeat timeout)".to_owned()
    } else {
        return Ok(entry);
    };
    Err(CallbackError::RentalNotCurrent {
        uid: uid.to_string(),
        rental,
        why,
    })
}

/// How far along a state is: unknown, starting, running, exited.
fn rank(state: Option<RunnerState>) -> u8 {
    match state {
        None => 0,
        Some(RunnerState::Starting) => 1,
        Some(RunnerState::Running | RunnerState::BackOff) => 2,
        Some(RunnerState::Exited) => 3,
    }
}

/// Reports runners that went silent; ends when the state is dropped.
pub(crate) async fn monitor_heartbeats(state: Weak<State>, timeout: Duration) {
    let period = (timeout / 4).clamp(Duration::from_millis(20), Duration::from_secs(5));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(state) = state.upgrade() else {
            return;
        };
        for (uid, rental) in state.sweep_silent(Instant::now()) {
            tracing::warn!(binding = %uid, "callback: runner sent no heartbeat in time; lost");
            state.sessions.fail(&uid, || CallbackError::RunnerGone {
                uid: uid.clone(),
                how: "been declared lost",
            });
            state.emit(&uid, rental, RunnerEventKind::Lost).await;
        }
    }
}
