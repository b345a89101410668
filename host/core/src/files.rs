//! The files a workload expects in its container: ConfigMap, Secret, downward-API and projected
//! volumes, as the Pod's container mounts them ([`FileMount`]), and the pure step that turns a
//! mount plus the objects it names into the files to write ([`build`]), with the kubelet's
//! rules: `items` pick keys and name their paths, `mode` and `defaultMode` set permissions, a
//! missing object or key fails the mount unless `optional`, and the whole Pod's files are bounded
//! by [`MAX_POD_FILE_BYTES`].
//!
//! Not for reading the objects (the node does that, with a client) and not for writing files (the
//! runner does that, atomically, at the mount's path).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::workload::EnvFromKind;

/// The most file content one Pod may carry, over all its mounts: 1 MiB, etcd's own limit on one
/// object, so any single ConfigMap or Secret fits and a Pod cannot ship gigabytes to a machine.
pub const MAX_POD_FILE_BYTES: usize = 1024 * 1024;

/// The permissions of a file whose volume sets no `defaultMode` (the API server's default, 0644).
pub const DEFAULT_FILE_MODE: u32 = 0o644;

/// One volume of files mounted by the container at `mount_path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMount {
    /// The volume's name.
    pub volume: String,
    /// The volume's field, `spec.volumes[2]`, for errors.
    pub field: String,
    /// Where the container sees the directory (an absolute path without `..`).
    pub mount_path: String,
    /// What fills the directory, in order (a later source's path replaces an earlier one).
    pub sources: Vec<FileSource>,
}

/// One source of files in a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// The keys of a ConfigMap or Secret.
    Object {
        /// ConfigMap or Secret.
        kind: EnvFromKind,
        /// The object's name, in the Pod's namespace.
        name: String,
        /// The keys to write and their paths; `None` writes every key under its own name.
        items: Option<Vec<KeyPath>>,
        /// Whether a missing object or item key leaves the files out instead of failing.
        optional: bool,
        /// The mode of a file whose item sets none.
        default_mode: u32,
        /// The source's field (`spec.volumes[0].configMap`), for errors.
        field: String,
    },
    /// Fields of the Pod itself.
    Downward {
        /// The files.
        items: Vec<DownwardItem>,
        /// The mode of a file whose item sets none.
        default_mode: u32,
    },
}

/// A key written at a path relative to the mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPath {
    /// The key in the object.
    pub key: String,
    /// The relative path (checked: no `..`, not absolute).
    pub path: String,
    /// Its mode, if set.
    pub mode: Option<u32>,
}

/// A Pod field written at a path relative to the mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownwardItem {
    /// The relative path (checked: no `..`, not absolute).
    pub path: String,
    /// The field (one of [`DOWNWARD_FIELDS`], or `metadata.labels['k']`,
    /// `metadata.annotations['k']`).
    pub field_path: String,
    /// Its mode, if set.
    pub mode: Option<u32>,
}

/// The Pod fields a downward-API volume can hold (besides one label or annotation).
pub const DOWNWARD_FIELDS: [&str; 5] = [
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "metadata.labels",
    "metadata.annotations",
];

/// Whether `field_path` is a field a downward-API volume can hold.
pub fn downward_field_supported(field_path: &str) -> bool {
    DOWNWARD_FIELDS.contains(&field_path) || one_of_map(field_path).is_some()
}

/// `("labels", "k")` for `metadata.labels['k']`.
fn one_of_map(field_path: &str) -> Option<(&str, &str)> {
    let rest = field_path.strip_prefix("metadata.")?;
    let (map, key) = rest.split_once("['")?;
    let key = key.strip_suffix("']")?;
    matches!(map, "labels" | "annotations").then_some((map, key))
}

/// Why a relative path cannot be a file of a volume, or `None` when it can: it must be
/// non-empty, relative, without a `..` or `.` component, and must not start with `..` (the
/// names the writer keeps for itself).
pub fn relative_path_error(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("must not be empty");
    }
    if path.starts_with('/') {
        return Some("must be a relative path");
    }
    if path.starts_with("..") {
        return Some("must not start with '..'");
    }
    if path.contains('\0') {
        return Some("must not contain a NUL byte");
    }
    if path
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Some("must not contain '..', '.' or empty components");
    }
    None
}

/// Why `path` cannot be a mount path, or `None`: it must be absolute, not `/`, and free of
/// `.`, `..` and empty components.
pub fn mount_path_error(path: &str) -> Option<&'static str> {
    let Some(rest) = path.strip_prefix('/') else {
        return Some("must be an absolute path");
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return Some("must not be the root directory");
    }
    if path.contains('\0') {
        return Some("must not contain a NUL byte");
    }
    if rest
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Some("must not contain '..', '.' or empty components");
    }
    None
}

/// One file to write: a path relative to its mount, a mode and the content.
#[derive(Clone, PartialEq, Eq)]
pub struct ResolvedFile {
    /// The relative path.
    pub path: String,
    /// Its permissions (0 to 0777).
    pub mode: u32,
    /// The content (possibly a secret).
    pub data: Vec<u8>,
}

impl std::fmt::Debug for ResolvedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedFile")
            .field("path", &self.path)
            .field("mode", &format_args!("{:o}", self.mode))
            .field("data", &format_args!("<{} bytes>", self.data.len()))
            .finish()
    }
}

/// The files of one mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedMount {
    /// Where the container sees them.
    pub mount_path: String,
    /// The files, sorted by path.
    pub files: Vec<ResolvedFile>,
}

/// The keys of a ConfigMap (`data` and `binaryData`) or Secret (`data`).
pub type ObjectData = BTreeMap<String, Vec<u8>>;

/// Why a Pod's files cannot be built; never holds a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilesError {
    /// A ConfigMap or Secret, or one of its keys, does not exist and is not optional.
    #[error("{field}: {what} does not exist")]
    Missing {
        /// The volume source's field.
        field: String,
        /// `ConfigMap chat-template`, or `key template.jinja of ConfigMap chat-template`.
        what: String,
    },
    /// The Pod's files together are over [`MAX_POD_FILE_BYTES`].
    #[error(
        "{field}: volume {volume:?} brings the Pod's files to {bytes} bytes, over the bound of \
         {MAX_POD_FILE_BYTES} bytes"
    )]
    TooLarge {
        /// The volume's field.
        field: String,
        /// The volume that went over.
        volume: String,
        /// The total with it.
        bytes: usize,
    },
    /// A key of an object whose items are not given cannot be a file name.
    #[error("{field}: key {key:?} of {object} cannot be a file name: {why}")]
    BadKey {
        /// The volume source's field.
        field: String,
        /// The key.
        key: String,
        /// The object.
        object: String,
        /// Why.
        why: &'static str,
    },
    /// Two files of one mount collide (one is a directory of the other).
    #[error("{field}: path {path:?} is both a file and a directory in volume {volume:?}")]
    Conflict {
        /// The volume's field.
        field: String,
        /// The volume.
        volume: String,
        /// The path.
        path: String,
    },
}

/// Builds the files of `mounts` from the objects `lookup` finds (`None`: the object does not
/// exist) and the Pod's `meta`, bounding their total size.
pub fn build<'a>(
    mounts: &[FileMount],
    meta: &ObjectMeta,
    lookup: impl Fn(EnvFromKind, &str) -> Option<&'a ObjectData>,
) -> Result<Vec<ResolvedMount>, FilesError> {
    let mut total = 0usize;
    let mut out = Vec::with_capacity(mounts.len());
    for mount in mounts {
        let mut files: BTreeMap<String, ResolvedFile> = BTreeMap::new();
        for source in &mount.sources {
            for file in source_files(source, meta, &lookup)? {
                files.insert(file.path.clone(), file);
            }
        }
        total += files.values().map(|f| f.data.len()).sum::<usize>();
        if total > MAX_POD_FILE_BYTES {
            return Err(FilesError::TooLarge {
                field: mount.field.clone(),
                volume: mount.volume.clone(),
                bytes: total,
            });
        }
        check_conflicts(mount, &files)?;
        out.push(ResolvedMount {
            mount_path: mount.mount_path.clone(),
            files: files.into_values().collect(),
        });
    }
    Ok(out)
}

fn check_conflicts(
    mount: &FileMount,
    files: &BTreeMap<String, ResolvedFile>,
) -> Result<(), FilesError> {
    for path in files.keys() {
        let mut prefix = path.as_str();
        while let Some((parent, _)) = prefix.rsplit_once('/') {
            if files.contains_key(parent) {
                return Err(FilesError::Conflict {
                    field: mount.field.clone(),
                    volume: mount.volume.clone(),
                    path: parent.to_owned(),
                });
            }
            prefix = parent;
        }
    }
    Ok(())
}

fn source_files<'a>(
    source: &FileSource,
    meta: &ObjectMeta,
    lookup: &impl Fn(EnvFromKind, &str) -> Option<&'a ObjectData>,
) -> Result<Vec<ResolvedFile>, FilesError> {
    match source {
        FileSource::Downward {
            items,
            default_mode,
        } => Ok(items
            .iter()
            .map(|i| ResolvedFile {
                path: i.path.clone(),
                mode: i.mode.unwrap_or(*default_mode),
                data: downward_value(meta, &i.field_path).into_bytes(),
            })
            .collect()),
        FileSource::Object {
            kind,
            name,
            items,
            optional,
            default_mode,
            field,
        } => {
            let object = format!("{} {name}", kind_name(*kind));
            let Some(data) = lookup(*kind, name) else {
                if *optional {
                    return Ok(Vec::new());
                }
                return Err(FilesError::Missing {
                    field: field.clone(),
                    what: object,
                });
            };
            object_files(
                data,
                items.as_deref(),
                *optional,
                *default_mode,
                field,
                &object,
            )
        }
    }
}

fn object_files(
    data: &ObjectData,
    items: Option<&[KeyPath]>,
    optional: bool,
    default_mode: u32,
    field: &str,
    object: &str,
) -> Result<Vec<ResolvedFile>, FilesError> {
    let Some(items) = items else {
        let mut out = Vec::with_capacity(data.len());
        for (key, value) in data {
            if let Some(why) = relative_path_error(key).or_else(|| {
                key.contains('/')
                    .then_some("a key without items must not contain '/'")
            }) {
                return Err(FilesError::BadKey {
                    field: field.to_owned(),
                    key: key.clone(),
                    object: object.to_owned(),
                    why,
                });
            }
            out.push(ResolvedFile {
                path: key.clone(),
                mode: default_mode,
                data: value.clone(),
            });
        }
        return Ok(out);
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match data.get(&item.key) {
            Some(value) => out.push(ResolvedFile {
                path: item.path.clone(),
                mode: item.mode.unwrap_or(default_mode),
                data: value.clone(),
            }),
            None if optional => {}
            None => {
                return Err(FilesError::Missing {
                    field: field.to_owned(),
                    what: format!("key {} of {object}", item.key),
                });
            }
        }
    }
    Ok(out)
}

fn kind_name(kind: EnvFromKind) -> &'static str {
    match kind {
        EnvFromKind::ConfigMap => "ConfigMap",
        EnvFromKind::Secret => "Secret",
    }
}

/// The content of a downward-API file, as the kubelet writes it (a map is `key="value"` lines,
/// sorted, values quoted).
pub fn downward_value(meta: &ObjectMeta, field_path: &str) -> String {
    let map_text = |m: Option<&BTreeMap<String, String>>| {
        m.into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    match field_path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => map_text(meta.labels.as_ref()),
        "metadata.annotations" => map_text(meta.annotations.as_ref()),
        other => match one_of_map(other) {
            Some(("labels", key)) => meta.labels.as_ref().and_then(|m| m.get(key)),
            Some((_, key)) => meta.annotations.as_ref().and_then(|m| m.get(key)),
            None => None,
        }
        .cloned()
        .unwrap_or_default(),
    }
}
