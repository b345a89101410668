//! The provider conformance suite: one set of contract tests (`suite`) run against every
//! adapter with its simulator (RunPod, Lambda Cloud, Vast.ai) and against the fake. Every
//! injected fault asserts its failure class and that the simulator's ledger shows no leaked or
//! duplicate instance.

mod harness;
mod macros;
mod suite;

mod fake;
mod lambda;
mod runpod;
mod vast;
