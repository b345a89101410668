//! The canonical GPU table: provider spellings map to one model; unknown and ambiguous names are
//! kept, never guessed.

use neocloud_core::GpuModel;
use neocloud_core::gpu_table::KNOWN_GPUS;

fn resolved(name: &str, memory: Option<u32>) -> (String, Option<u32>, bool) {
    let g = GpuModel::from_provider(name, memory);
    (g.name().to_owned(), g.memory_gib(), g.is_known())
}

#[test]
fn provider_spellings_map_to_one_canonical_model_and_memory() {
    let cases: &[(&str, &str, u32)] = &[
        ("NVIDIA A40", "A40", 48),
        ("A40", "A40", 48),
        ("gpu_1x_a10", "A10", 24),
        ("RTX 4090", "RTX 4090", 24),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 24),
        ("H100 SXM", "H100 SXM", 80),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 80),
        ("gpu_1x_h100_sxm5", "H100 SXM", 80),
        ("gpu_1x_h100_pcie", "H100 PCIe", 80),
        ("H100 NVL", "H100 NVL", 94),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 80),
        ("gpu_8x_a100_80gb_sxm4", "A100 SXM 80GB", 80),
        ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 80),
        ("gpu_1x_a6000", "RTX A6000", 48),
        ("NVIDIA RTX A6000", "RTX A6000", 48),
        ("gpu_1x_rtx6000", "Quadro RTX 6000", 24),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", 48),
        ("GTX 1070", "GTX 1070", 8),
        ("L40S", "L40S", 48),
        ("gpu_1x_gh200", "GH200", 96),
        ("Tesla V100-SXM2-16GB", "V100 16GB", 16),
    ];
    for (raw, canonical, memory) in cases {
        assert_eq!(
            resolved(raw, None),
            (canonical.to_string(), Some(*memory), true),
            "{raw}"
        );
    }
}

#[test]
fn an_ambiguous_name_is_settled_by_the_reported_memory_or_kept_unknown() {
    assert_eq!(
        resolved("A100 SXM4", Some(80)),
        ("A100 SXM 80GB".into(), Some(80), true)
    );
    assert_eq!(
        resolved("gpu_1x_a100_sxm4", Some(40)),
        ("A100 SXM 40GB".into(), Some(40), true)
    );
    assert_eq!(
        resolved("A100 SXM4", Some(79)),
        ("A100 SXM 80GB".into(), Some(80), true)
    );
    assert_eq!(
        resolved("A100 SXM4", None),
        ("A100 SXM4".into(), None, false)
    );
    assert_eq!(
        resolved("A100 SXM4", Some(60)),
        ("A100 SXM4".into(), Some(60), false)
    );
    assert_eq!(resolved("H100", Some(80)), ("H100".into(), Some(80), false));
}

#[test]
fn an_unknown_name_is_kept_verbatim_with_the_reported_memory() {
    assert_eq!(
        resolved("Instinct MI300X", Some(192)),
        ("Instinct MI300X".into(), Some(192), false)
    );
    assert_eq!(
        resolved("Mystery GPU", None),
        ("Mystery GPU".into(), None, false)
    );
}

#[test]
fn a_workload_asking_for_a_family_accepts_every_variant() {
    let names: Vec<String> = GpuModel::accepted_by_name("A100")
        .iter()
        .map(|g| g.name().to_owned())
        .collect();
    assert_eq!(
        names,
        vec![
            "A100 SXM 80GB",
            "A100 SXM 40GB",
            "A100 PCIe 80GB",
            "A100 PCIe 40GB"
        ]
    );
}

#[test]
fn an_unknown_requested_model_accepts_only_the_same_spelling() {
    let wanted = &GpuModel::accepted_by_name("MI300X")[0];
    assert!(wanted.accepts(&GpuModel::from_provider("mi300x", None)));
    assert!(!wanted.accepts(&GpuModel::from_provider("MI250", None)));
    assert!(!wanted.accepts(&GpuModel::from_provider("A40", None)));
}

#[test]
fn every_canonical_name_resolves_to_itself() {
    for g in KNOWN_GPUS {
        assert_eq!(
            resolved(g.canonical, Some(g.memory_gib)),
            (g.canonical.to_owned(), Some(g.memory_gib), true),
            "{}",
            g.canonical
        );
    }
}
