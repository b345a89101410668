//! GPU model names: turns each provider's spelling ("NVIDIA A40", "gpu_1x_a10", "H100 SXM") into
//! one canonical model with its memory, using [`crate::gpu_table`].
//!
//! Unknown or ambiguous names are kept as the provider wrote them and reported, never guessed.
//! Not for pricing or capacity.

use serde::{Deserialize, Serialize};

use crate::gpu_table::{KNOWN_GPUS, KnownGpu};

/// A GPU model as offered by a provider or accepted by a workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum GpuModel {
    /// A model from the canonical table.
    Known {
        /// The canonical name, e.g. "A100 SXM 80GB".
        name: String,
        /// Memory per GPU in GiB, from the table.
        memory_gib: u32,
    },
    /// A name the table does not know (or cannot tell apart), kept verbatim.
    Unknown {
        /// The name exactly as the provider or the Pod wrote it.
        provider_name: String,
        /// Memory per GPU the provider reported, if it did.
        reported_memory_gib: Option<u32>,
    },
}

impl GpuModel {
    /// Resolves a provider's GPU name. `reported_memory_gib` settles ambiguous names ("A100
    /// SXM4" exists with 40 and 80 GiB); without it an ambiguous name stays unknown.
    pub fn from_provider(name: &str, reported_memory_gib: Option<u32>) -> GpuModel {
        let normalized = normalize(name);
        let matches: Vec<&KnownGpu> = lookup(&normalized).collect();
        let chosen = match matches.as_slice() {
            [one] => Some(*one),
            _ => reported_memory_gib.and_then(|mem| {
                let close: Vec<&&KnownGpu> = matches
                    .iter()
                    .filter(|g| memory_close(g.memory_gib, mem))
                    .collect();
                (close.len() == 1).then(|| *close[0])
            }),
        };
        match chosen {
            Some(known) => GpuModel::known(known),
            None => GpuModel::Unknown {
                provider_name: name.to_owned(),
                reported_memory_gib,
            },
        }
    }

    /// Every model a workload means by `name`: "A100" means all four A100 variants; an unknown
    /// name yields one [`GpuModel::Unknown`] that only matches offers spelled the same way.
    pub fn accepted_by_name(name: &str) -> Vec<GpuModel> {
        let normalized = normalize(name);
        let found: Vec<GpuModel> = lookup(&normalized).map(GpuModel::known).collect();
        if found.is_empty() {
            vec![GpuModel::Unknown {
                provider_name: name.to_owned(),
                reported_memory_gib: None,
            }]
        } else {
            found
        }
    }

    fn known(g: &KnownGpu) -> GpuModel {
        GpuModel::Known {
            name: g.canonical.to_owned(),
            memory_gib: g.memory_gib,
        }
    }

    /// The canonical name, or the provider's own name when unknown.
    pub fn name(&self) -> &str {
        match self {
            GpuModel::Known { name, .. } => name,
            GpuModel::Unknown { provider_name, .. } => provider_name,
        }
    }

    /// Memory per GPU in GiB: from the table, or as reported by the provider for unknown names.
    pub fn memory_gib(&self) -> Option<u32> {
        match self {
            GpuModel::Known { memory_gib, .. } => Some(*memory_gib),
            GpuModel::Unknown {
                reported_memory_gib,
                ..
            } => *reported_memory_gib,
        }
    }

    /// Whether the canonical table knows this model.
    pub fn is_known(&self) -> bool {
        matches!(self, GpuModel::Known { .. })
    }

    /// Whether an offer's GPU is this accepted model: known models by canonical name, unknown
    /// ones only by the same spelling (ignoring case and punctuation).
    pub fn accepts(&self, offered: &GpuModel) -> bool {
        match (self, offered) {
            (GpuModel::Known { name: a, .. }, GpuModel::Known { name: b, .. }) => a == b,
            (
                GpuModel::Unknown {
                    provider_name: a, ..
                },
                GpuModel::Unknown {
                    provider_name: b, ..
                },
            ) => normalize(a) == normalize(b),
            _ => false,
        }
    }
}

fn lookup(normalized: &str) -> impl Iterator<Item = &'static KnownGpu> + '_ {
    KNOWN_GPUS
        .iter()
        .filter(move |g| normalize(g.canonical) == normalized || g.aliases.contains(&normalized))
}

fn memory_close(table_gib: u32, reported_gib: u32) -> bool {
    let tolerance = (table_gib / 20).max(2);
    table_gib.abs_diff(reported_gib) <= tolerance
}

/// Normalises a GPU name for lookup: lower case, `_` and `-` as spaces, vendor words ("nvidia",
/// "geforce", "tesla", "quadro") and a Lambda instance-type prefix ("gpu_8x_") removed.
pub fn normalize(name: &str) -> String {
    let lowered = name.to_lowercase().replace(['_', '-'], " ");
    let mut words: Vec<&str> = lowered
        .split_whitespace()
        .filter(|w| !matches!(*w, "nvidia" | "geforce" | "tesla" | "quadro"))
        .collect();
    if words.len() > 2 && words[0] == "gpu" && is_count_word(words[1]) {
        words.drain(..2);
    }
    words.join(" ")
}

fn is_count_word(word: &str) -> bool {
    word.strip_suffix('x')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}
