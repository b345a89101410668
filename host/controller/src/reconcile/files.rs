//! Resolving a workload's files: the ConfigMaps and Secrets its file volumes name, read from
//! the Pod's namespace (`get` only: the RBAC's `aibrix-neocloud-node-env` role), built into the
//! files the runner writes ([`neocloud_core::files::build`]: items, modes, `optional`, the
//! Pod's size bound), and kept fresh: while a runner runs, the node reads them again every
//! [`FILES_REFRESH`] and hands the callback any change, which the runner fetches at its next
//! heartbeat interval, so an edit reaches the files within about half a minute.
//!
//! Values never appear in errors or logs. Not for the environment (see `env`); the objects are
//! read by `objects`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::{Client, ResourceExt};
use neocloud_core::EnvFromKind;
use neocloud_core::files::{FileMount, FileSource, FilesError, ObjectData, ResolvedMount, build};

use super::objects::{Keys, Objects, ReadError};
use neocloud_remote::callback;

/// How often the node reads the objects of a running workload's files again.
pub const FILES_REFRESH: Duration = Duration::from_secs(15);

/// The reason on a Pod whose files cannot be made, as a kubelet's.
pub const FAILED_MOUNT: &str = "FailedMount";

/// Why a Pod's files could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// Its volumes are refused (translation refuses the Pod first, so this is rare).
    #[error("{0}")]
    Refused(#[from] neocloud_core::PodRefused),
    /// An object or key is missing, or the files are over the bound.
    #[error("{0}")]
    Files(#[from] FilesError),
    /// Reading an object failed.
    #[error(transparent)]
    Read(#[from] ReadError),
}

/// The Pod's file mounts and their files, as the runner gets them.
#[derive(Debug, Clone, Default)]
pub struct PodFiles {
    /// The mounts, for reading them again.
    pub mounts: Vec<FileMount>,
    /// The files.
    pub files: Vec<callback::FileMount>,
}

/// The Pod's file mounts and their files now.
pub async fn resolve_pod(client: &Client, pod: &Pod) -> Result<PodFiles, ResolveError> {
    let mounts = neocloud_core::file_mounts(pod)?;
    let files = resolve(client, pod, &mounts).await?;
    Ok(PodFiles { mounts, files })
}

/// The files of `mounts` for `pod` now.
pub async fn resolve(
    client: &Client,
    pod: &Pod,
    mounts: &[FileMount],
) -> Result<Vec<callback::FileMount>, ResolveError> {
    if mounts.is_empty() {
        return Ok(Vec::new());
    }
    let mut objects = Objects::new(client, &pod.namespace().unwrap_or_default());
    // Files take a ConfigMap's binaryData and data together.
    let mut read: BTreeMap<(bool, String), Option<ObjectData>> = BTreeMap::new();
    for mount in mounts {
        for source in &mount.sources {
            if let FileSource::Object { kind, name, .. } = source {
                let key = (*kind == EnvFromKind::Secret, name.clone());
                if let std::collections::btree_map::Entry::Vacant(slot) = read.entry(key) {
                    slot.insert(objects.get(*kind, name).await?.map(Keys::all));
                }
            }
        }
    }
    let lookup = |kind: EnvFromKind, name: &str| {
        read.get(&(kind == EnvFromKind::Secret, name.to_owned()))
            .and_then(Option::as_ref)
    };
    let built = build(mounts, &pod.metadata, lookup)?;
    Ok(built.into_iter().map(to_wire).collect())
}

fn to_wire(m: ResolvedMount) -> callback::FileMount {
    callback::FileMount {
        mount_path: m.mount_path,
        files: m
            .files
            .into_iter()
            .map(|f| callback::File {
                path: f.path,
                mode: f.mode,
                data: f.data,
            })
            .collect(),
    }
}
