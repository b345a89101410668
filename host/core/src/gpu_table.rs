//! The canonical GPU model table: one row per model we know, with its memory and the names each
//! provider uses for it (already normalised by [`crate::gpu::normalize`]).
//!
//! Data only. A name listed under two rows is ambiguous and is resolved by the memory size the
//! provider reports; see [`crate::gpu`]. Not for prices or availability.

/// A GPU model we know: its canonical name, memory, and every provider alias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownGpu {
    /// The one name used across providers, e.g. "H100 SXM".
    pub canonical: &'static str,
    /// Memory per GPU in GiB.
    pub memory_gib: u32,
    /// Normalised names providers use for this model (RunPod ids and display names, Lambda
    /// instance-type suffixes, Vast `gpu_name`s).
    pub aliases: &'static [&'static str],
}

const fn gpu(
    canonical: &'static str,
    memory_gib: u32,
    aliases: &'static [&'static str],
) -> KnownGpu {
    KnownGpu {
        canonical,
        memory_gib,
        aliases,
    }
}

/// Every GPU model we know.
pub static KNOWN_GPUS: &[KnownGpu] = &[
    gpu("B200", 180, &["b200", "b200 sxm6"]),
    gpu("H200", 141, &["h200", "h200 sxm", "h200 nvl", "h200 141gb"]),
    gpu("GH200", 96, &["gh200", "gh200 480gb"]),
    gpu(
        "H100 SXM",
        80,
        &[
            "h100 sxm",
            "h100 sxm5",
            "h100 80gb hbm3",
            "h100 sxm 80gb",
            "h100",
        ],
    ),
    gpu("H100 PCIe", 80, &["h100 pcie", "h100 pcie 80gb", "h100"]),
    gpu("H100 NVL", 94, &["h100 nvl", "h100 nvl 94gb"]),
    gpu(
        "A100 SXM 80GB",
        80,
        &[
            "a100 sxm4 80gb",
            "a100 80gb sxm4",
            "a100 sxm 80gb",
            "a100 sxm4",
            "a100 sxm",
            "a100",
        ],
    ),
    gpu(
        "A100 SXM 40GB",
        40,
        &[
            "a100 sxm4 40gb",
            "a100 40gb sxm4",
            "a100 sxm4",
            "a100 sxm",
            "a100",
        ],
    ),
    gpu(
        "A100 PCIe 80GB",
        80,
        &["a100 80gb pcie", "a100 pcie 80gb", "a100 pcie", "a100"],
    ),
    gpu(
        "A100 PCIe 40GB",
        40,
        &["a100 pcie 40gb", "a100 40gb pcie", "a100 pcie", "a100"],
    ),
    gpu("A40", 48, &["a40"]),
    gpu("A10", 24, &["a10"]),
    gpu("A10G", 24, &["a10g"]),
    gpu("L40S", 48, &["l40s"]),
    gpu("L40", 48, &["l40"]),
    gpu("L4", 24, &["l4"]),
    gpu(
        "RTX 6000 Ada",
        48,
        &["rtx 6000 ada", "rtx 6000 ada generation", "rtx 6000ada"],
    ),
    gpu("Quadro RTX 6000", 24, &["rtx6000", "rtx 6000"]),
    gpu("RTX A6000", 48, &["rtx a6000", "a6000"]),
    gpu("RTX A5000", 24, &["rtx a5000", "a5000"]),
    gpu("RTX A4000", 16, &["rtx a4000", "a4000"]),
    gpu("RTX 5090", 32, &["rtx 5090"]),
    gpu("RTX 4090", 24, &["rtx 4090"]),
    gpu("RTX 4080", 16, &["rtx 4080"]),
    gpu("RTX 3090", 24, &["rtx 3090"]),
    gpu("RTX 3080", 10, &["rtx 3080"]),
    gpu("GTX 1070", 8, &["gtx 1070"]),
    gpu("V100 16GB", 16, &["v100 sxm2 16gb", "v100 16gb", "v100"]),
    gpu("V100 32GB", 32, &["v100 sxm2 32gb", "v100 32gb", "v100"]),
];
