//! The operator commands of the `neocloud-node` binary, outside the controller library: `cost
//! report` (`cost`), `policy check|eval|test|bench` (`policy`, `policy_test`) and `policy
//! push|pull|sign|verify|keygen` (`policy_oci`), `provider smoke` (`provider`, `smoke`), and `relay`, the process of a burst Pod's relay Pod.
//! Each reads what it needs through the library's public modules (`crd`, `policies`, ...).

pub mod cost;
pub mod policy;
pub mod policy_oci;
pub mod policy_test;
pub mod provider;
pub mod relay;
pub mod smoke;
