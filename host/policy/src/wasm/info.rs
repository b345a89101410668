//! What a loaded component is: digest, size, the roles and world it implements, and its imports
//! and exports by name. Shown by `policy check` and recorded in a policy's status.
//!
//! Not for deciding whether a component may load (see [`super::policy`] and [`super::link`]).

use wasmtime::Engine;
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use super::bindings::PACKAGE;
use super::error::Role;
use super::source::Loaded;

/// Facts about a loaded component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyInfo {
    /// Lower-case hex sha256 of the component bytes.
    pub digest: String,
    /// Size of the component in bytes.
    pub size: usize,
    /// Roles of `neocloud:policy@0.1.0` the component exports.
    pub roles: Vec<Role>,
    /// The narrowest world of the package that covers `roles` (e.g. `placement-policy`), or
    /// `none` when it exports no role.
    pub world: String,
    /// Names of the imports the host must provide; imports that only carry types (such as
    /// `neocloud:policy/types@0.1.0`) are left out.
    pub imports: Vec<String>,
    /// Names of the component's exports.
    pub exports: Vec<String>,
}

impl PolicyInfo {
    pub(crate) fn inspect(engine: &Engine, component: &Component, loaded: &Loaded) -> Self {
        let ty = component.component_type();
        let imports: Vec<String> = ty
            .imports(engine)
            .filter(|(_, item)| !types_only(engine, &item.ty))
            .map(|(n, _)| n.to_owned())
            .collect();
        let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_owned()).collect();
        let roles = roles(&exports);
        Self {
            digest: loaded.digest.clone(),
            size: loaded.bytes.len(),
            world: world_name(&roles),
            roles,
            imports,
            exports,
        }
    }
}

/// An instance import whose exports are all types needs nothing from the host.
fn types_only(engine: &Engine, item: &ComponentItem) -> bool {
    match item {
        ComponentItem::ComponentInstance(instance) => instance
            .exports(engine)
            .all(|(_, export)| matches!(export.ty, ComponentItem::Type(_))),
        ComponentItem::Type(_) => true,
        _ => false,
    }
}

fn qualified(name: &str) -> String {
    let (package, version) = PACKAGE.split_once('@').unwrap_or((PACKAGE, ""));
    format!("{package}/{name}@{version}")
}

fn roles(exports: &[String]) -> Vec<Role> {
    [Role::Placement, Role::Fallback, Role::Pricing]
        .into_iter()
        .filter(|role| exports.contains(&qualified(&role.to_string())))
        .collect()
}

fn world_name(roles: &[Role]) -> String {
    match roles {
        [] => "none".into(),
        [one] => qualified(&format!("{one}-policy")),
        [_, _, _] => qualified("full-policy"),
        several => {
            let names: Vec<String> = several.iter().map(|r| format!("{r}-policy")).collect();
            format!("{PACKAGE} worlds {}", names.join(" + "))
        }
    }
}
