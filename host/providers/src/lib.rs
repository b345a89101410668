//! The `Provider` trait and its adapters (fake, RunPod, Lambda Cloud, Vast.ai): the only place
//! that speaks a cloud's HTTP API. Adapters translate wire types into `neocloud-core` types and
//! classify every error; they never decide where to rent.
