//! The node's custom resources: the types and their CRDs are `neocloud-api`'s, re-exported
//! here with [`install`], which needs the API server and is the controllers'.

pub use neocloud_api::*;
pub use neocloud_controller::crds::install;
