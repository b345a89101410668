//! Local, stateful simulators of the RunPod, Lambda Cloud and Vast.ai HTTP APIs, with a market,
//! a billing ledger and fault injection, so that adapters are tested over real HTTP without
//! spending money. It depends on nothing else of ours.
