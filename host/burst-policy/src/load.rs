//! Loading one `BurstPolicy`: CEL rules compiled by the CEL engine, or a Wasm component read
//! from a file, a ConfigMap key, a URL pinned by sha256 or an OCI artifact pinned by digest
//! (see [`super::oci`]) and prepared by the Wasm engine. The result is a [`LoadedPolicy`] or
//! every error found, each naming the field it comes from.
//!
//! Not for writing status (see [`super::status`]) or deciding anything with the policy.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, ResourceExt};
use neocloud_policy::cel::{CelEngine, CelError, CompiledConstraint, CompiledRank};
use neocloud_policy::wasm::{
    Capabilities, FailurePolicy as WasmFailure, Mode, PolicySettings, PolicySource, WasmEngine,
    WasmPolicy, sha256_hex,
};

use neocloud_api::{
    BurstPolicy, CelRules, ConfigMapKeyRef, FailurePolicy, PolicyError, PolicyMode, WasmSource,
};

/// What a loaded policy decides with.
#[derive(Debug, Clone)]
pub(crate) enum Body {
    /// CEL rules; at least one is set.
    Cel {
        constraint: Option<Arc<CompiledConstraint>>,
        rank: Option<Arc<CompiledRank>>,
    },
    /// A prepared Wasm component.
    Wasm(WasmPolicy),
}

/// A policy ready to serve.
#[derive(Debug, Clone)]
pub(crate) struct LoadedPolicy {
    pub digest: String,
    pub failure: FailurePolicy,
    pub mode: PolicyMode,
    /// `spec.maxReplacements`, checked.
    pub max_replacements: Option<u32>,
    /// `spec.egress`, checked.
    pub egress: Option<super::EgressLimit>,
    pub body: Body,
}

impl LoadedPolicy {
    /// "CEL" or "Wasm (placement, pricing)", for the Loaded condition's message.
    pub fn describe(&self) -> String {
        match &self.body {
            Body::Cel { .. } => "CEL rules".to_owned(),
            Body::Wasm(p) => {
                let roles: Vec<String> = p.info().roles.iter().map(|r| r.to_string()).collect();
                format!("Wasm component ({})", roles.join(", "))
            }
        }
    }
}

/// Why a policy did not load: every error, and whether loading it again unchanged may succeed
/// (its registry was unreachable).
#[derive(Debug, Clone)]
pub(crate) struct LoadFailure {
    pub errors: Vec<PolicyError>,
    pub transient: bool,
}

impl From<Vec<PolicyError>> for LoadFailure {
    fn from(errors: Vec<PolicyError>) -> Self {
        Self {
            errors,
            transient: false,
        }
    }
}

/// Loads `bp`. Blocking work (compiling, reading files, fetching URLs) runs off the async
/// worker threads.
pub(crate) async fn load(
    client: &kube::Client,
    cel: &Arc<CelEngine>,
    wasm: &WasmEngine,
    wasm_dir: &Path,
    bp: &BurstPolicy,
) -> Result<LoadedPolicy, LoadFailure> {
    let spec = &bp.spec;
    let max_replacements = check_max_replacements(spec.max_replacements)?;
    let egress = spec
        .egress
        .as_ref()
        .map(super::EgressLimit::check)
        .transpose()?;
    let (digest, body) = match (&spec.cel, &spec.wasm) {
        (Some(rules), None) => {
            let (cel, rules) = (Arc::clone(cel), rules.clone());
            blocking(move || load_cel(&cel, &rules)).await?
        }
        (None, Some(source)) => {
            let source = wasm_source(client, wasm_dir, source).await?;
            let (engine, settings) = (wasm.clone(), settings(bp));
            blocking(move || load_wasm(&engine, &source, settings)).await?
        }
        _ => {
            return Err(vec![error(
                "spec",
                "exactly one of spec.wasm and spec.cel must be set",
            )]
            .into());
        }
    };
    Ok(LoadedPolicy {
        digest,
        failure: spec.failure_policy,
        mode: spec.mode,
        max_replacements,
        egress,
        body,
    })
}

/// The most `spec.maxReplacements` may be (the API server refuses more as well).
pub(crate) const MAX_REPLACEMENTS_LIMIT: u32 = 100;

/// `spec.maxReplacements` if it is within bounds (an API server without the CRD's validation
/// rules may have let a larger one in).
pub(crate) fn check_max_replacements(value: Option<u32>) -> Result<Option<u32>, LoadFailure> {
    match value {
        Some(n) if n > MAX_REPLACEMENTS_LIMIT => Err(vec![error(
            "spec.maxReplacements",
            format!("{n} is more than {MAX_REPLACEMENTS_LIMIT}"),
        )]
        .into()),
        other => Ok(other),
    }
}

async fn blocking<T: Send + 'static, E: Into<LoadFailure> + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, LoadFailure> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(Into::into),
        Err(e) => Err(vec![error("spec", format!("the loader thread failed: {e}"))].into()),
    }
}

pub(crate) fn error(field: &str, message: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.to_owned(),
        message: message.into(),
        line: None,
        column: None,
    }
}

/// The digest of CEL rules: sha256 of `spec.cel` as JSON (`{"constraints":..,"rank":..}`).
pub(crate) fn cel_digest(rules: &CelRules) -> String {
    let text = serde_json::to_string(rules).unwrap_or_default();
    format!("sha256:{}", sha256_hex(text.as_bytes()))
}

fn load_cel(cel: &CelEngine, rules: &CelRules) -> Result<(String, Body), Vec<PolicyError>> {
    if rules.constraints.is_none() && rules.rank.is_none() {
        return Err(vec![error(
            "spec.cel",
            "CEL rules set neither constraints nor rank",
        )]);
    }
    let mut errors = Vec::new();
    let constraint = rules.constraints.as_deref().and_then(|src| {
        cel.compile_constraint(src)
            .map_err(|e| errors.push(cel_error("spec.cel.constraints", &e)))
            .ok()
    });
    let rank = rules.rank.as_deref().and_then(|src| {
        cel.compile_rank(src)
            .map_err(|e| errors.push(cel_error("spec.cel.rank", &e)))
            .ok()
    });
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok((cel_digest(rules), Body::Cel { constraint, rank }))
}

/// A CEL compile error with its position, where the error has one.
pub(crate) fn cel_error(field: &str, e: &CelError) -> PolicyError {
    let at = e.position();
    PolicyError {
        field: field.to_owned(),
        message: e.to_string(),
        line: at.map(|p| p.line),
        column: at.map(|p| p.column),
    }
}

/// Settings of a BurstPolicy's component: the default budget, the bounded log, and WASI that
/// grants nothing (componentize-js and -py guests import it); `failurePolicy` and `mode` as set.
fn settings(bp: &BurstPolicy) -> PolicySettings {
    let mut s = PolicySettings::named(bp.name_any());
    s.capabilities = Capabilities {
        log: true,
        deny_all_wasi: true,
    };
    s.failure_policy = match bp.spec.failure_policy {
        FailurePolicy::Fail => WasmFailure::Fail,
        FailurePolicy::Ignore => WasmFailure::Ignore,
    };
    s.mode = match bp.spec.mode {
        PolicyMode::Enforce => Mode::Enforce,
        PolicyMode::Audit => Mode::Audit,
    };
    s
}

/// Which field of `spec.wasm` names the source, for errors.
fn source_field(s: &WasmSource) -> &'static str {
    if s.path.is_some() {
        "spec.wasm.path"
    } else if s.config_map.is_some() {
        "spec.wasm.configMap"
    } else if s.url.is_some() {
        "spec.wasm.url"
    } else {
        "spec.wasm.oci"
    }
}

/// The source to load, with the ConfigMap's or the OCI artifact's bytes read now. The field of
/// any error travels along as the source's first element.
async fn wasm_source(
    client: &kube::Client,
    wasm_dir: &Path,
    s: &WasmSource,
) -> Result<(&'static str, PolicySource), LoadFailure> {
    let field = source_field(s);
    let sha256 = s.sha256.clone();
    let source = match (&s.path, &s.config_map, &s.url, &s.oci) {
        (None, None, None, Some(_)) => {
            if let Some(sha256) = &s.sha256 {
                let message = format!(
                    "sha256 {sha256} does not apply to an oci source: the digest in oci pins it"
                );
                return Err(vec![error("spec.wasm.sha256", message)].into());
            }
            super::oci::source(client, s)
                .await
                .map_err(|f| LoadFailure {
                    errors: f.errors,
                    transient: f.transient,
                })?
        }
        (Some(path), None, None, None) => PolicySource::File {
            path: confined(wasm_dir, path).map_err(|m| vec![error(field, m)])?,
            sha256,
        },
        (None, Some(cm), None, None) => PolicySource::Bytes {
            name: format!("configmap {}/{} key {}", cm.namespace, cm.name, cm.key),
            bytes: config_map_bytes(client, cm)
                .await
                .map_err(|m| vec![error(field, m)])?,
            sha256,
        },
        (None, None, Some(url), None) => PolicySource::Url {
            url: url.clone(),
            sha256: sha256.unwrap_or_default(),
        },
        _ => {
            let message = "exactly one of path, configMap, url and oci must be set";
            return Err(vec![error("spec.wasm", message)].into());
        }
    };
    Ok((field, source))
}

/// `path` as a file inside `dir` (a relative one is taken inside it), with symlinks resolved.
/// A path that names anything outside `dir`, lexically or through a symlink, is refused before
/// anything outside is looked at, with one message whether or not it exists.
pub(crate) fn confined(dir: &Path, path: &str) -> Result<PathBuf, String> {
    let outside = || {
        format!(
            "{path:?} is outside policies.wasmDir {}: a policy file is read only from there \
             (a file in the node's image or a volume mounted there)",
            dir.display()
        )
    };
    let wanted = dir.join(path);
    let climbs = Path::new(path)
        .components()
        .any(|c| matches!(c, Component::ParentDir));
    if climbs || !wanted.starts_with(dir) {
        return Err(outside());
    }
    let root = dir
        .canonicalize()
        .map_err(|e| format!("policies.wasmDir {} cannot be read: {e}", dir.display()))?;
    let real = wanted
        .canonicalize()
        .map_err(|e| format!("{path:?} in policies.wasmDir cannot be read: {e}"))?;
    if !real.starts_with(&root) {
        return Err(outside());
    }
    Ok(real)
}

/// The bytes under `key` in the ConfigMap's `binaryData`, else its `data` as UTF-8 text.
async fn config_map_bytes(client: &kube::Client, r: &ConfigMapKeyRef) -> Result<Vec<u8>, String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &r.namespace);
    let (ns, name, key) = (&r.namespace, &r.name, &r.key);
    let cm = api
        .get_opt(name)
        .await
        .map_err(|e| format!("failed to read configmap {ns}/{name}: {e}"))?
        .ok_or_else(|| format!("configmap {ns}/{name} does not exist; {CONFIG_MAP_HINT}"))?;
    if let Some(b) = cm.binary_data.as_ref().and_then(|d| d.get(key)) {
        return Ok(b.0.clone());
    }
    if let Some(text) = cm.data.as_ref().and_then(|d| d.get(key)) {
        return Ok(text.clone().into_bytes());
    }
    Err(format!(
        "configmap {ns}/{name} has no key {key} in binaryData or data; {CONFIG_MAP_HINT}"
    ))
}

/// What to do about a missing ConfigMap or key: the API server refuses ConfigMaps over 1 MiB,
/// so a larger component (any JavaScript or Python guest) never got there.
const CONFIG_MAP_HINT: &str = "create it with `kubectl create configmap NAME \
    --from-file=KEY=policy.wasm`; a ConfigMap holds at most 1 MiB, so a larger component \
    (JavaScript and Python guests are 12 MB and more) must come from spec.wasm.path or \
    spec.wasm.url with spec.wasm.sha256";

/// Compiles the component; a failure to fetch a `url` may pass, so it is marked transient.
fn load_wasm(
    engine: &WasmEngine,
    source: &(&'static str, PolicySource),
    settings: PolicySettings,
) -> Result<(String, Body), LoadFailure> {
    let (field, source) = source;
    let policy = engine.load(source, settings).map_err(|e| LoadFailure {
        errors: vec![error(field, e.to_string())],
        transient: e.is_transient(),
    })?;
    Ok((
        format!("sha256:{}", policy.info().digest),
        Body::Wasm(policy),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_replacements_above_the_limit_is_refused_naming_the_field_and_value() {
        assert_eq!(check_max_replacements(None).ok(), Some(None));
        assert_eq!(check_max_replacements(Some(100)).ok(), Some(Some(100)));
        let refused = check_max_replacements(Some(101)).expect_err("too many");
        let error = &refused.errors[0];
        assert_eq!(error.field, "spec.maxReplacements");
        assert_eq!(error.message, "101 is more than 100");
    }

    #[test]
    fn a_policy_path_is_read_only_inside_the_wasm_dir() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a.wasm"), b"\0asm").unwrap();
        std::fs::create_dir(root.join("team")).unwrap();
        std::fs::write(root.join("team/b.wasm"), b"\0asm").unwrap();
        std::os::unix::fs::symlink(root.join("team/b.wasm"), root.join("inside")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("escape")).unwrap();
        let real = root.canonicalize().unwrap();

        assert_eq!(confined(root, "a.wasm").unwrap(), real.join("a.wasm"));
        let absolute = root.join("team/b.wasm");
        assert_eq!(
            confined(root, absolute.to_str().unwrap()).unwrap(),
            real.join("team/b.wasm")
        );
        assert_eq!(confined(root, "inside").unwrap(), real.join("team/b.wasm"));

        for path in [
            "/etc/passwd",
            "/dev/zero",
            "../a.wasm",
            "team/../../x",
            "escape",
        ] {
            let refused = confined(root, path).expect_err(path);
            assert!(
                refused.contains(&format!("{path:?} is outside policies.wasmDir")),
                "{path}: {refused}"
            );
        }
        let missing = confined(root, "missing.wasm").expect_err("missing");
        assert!(
            missing.contains("\"missing.wasm\" in policies.wasmDir cannot be read"),
            "{missing}"
        );
        let nowhere = confined(Path::new("/nonexistent-neocloud"), "a.wasm").unwrap_err();
        assert!(
            nowhere.starts_with("policies.wasmDir /nonexistent-neocloud cannot be read"),
            "{nowhere}"
        );
    }
}
