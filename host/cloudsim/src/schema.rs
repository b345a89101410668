//! A small JSON shape checker used to validate request bodies as strictly as the real APIs:
//! unknown properties, missing required properties and wrong types, each with a JSON path.
//!
//! Not a JSON Schema implementation: cross-field rules live in each provider's handlers, and
//! each provider renders [`Violation`]s in its own error format.

use serde_json::Value;

/// The type a property must have.
#[derive(Debug, Clone, Copy)]
pub enum Ty {
    /// A JSON string.
    Str,
    /// An integer.
    Int,
    /// Any number.
    Num,
    /// A boolean.
    Bool,
    /// An array of strings.
    StrList,
    /// An object whose values are strings.
    StrMap,
    /// An object with these properties.
    Obj(&'static [Field]),
    /// An array of objects with these properties.
    ObjList(&'static [Field]),
    /// Anything (checked by the handler).
    Any,
}

/// One allowed property.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Property name.
    pub name: &'static str,
    /// Its type.
    pub ty: Ty,
    /// Whether it must be present.
    pub required: bool,
}

/// A required property.
pub const fn req(name: &'static str, ty: Ty) -> Field {
    Field {
        name,
        ty,
        required: true,
    }
}

/// An optional property.
pub const fn opt(name: &'static str, ty: Ty) -> Field {
    Field {
        name,
        ty,
        required: false,
    }
}

/// One way a body breaks its shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Violation {
    /// A property that the shape does not allow (`path` is the object, `name` the property).
    Unknown { path: String, name: String },
    /// A required property is absent.
    Missing { path: String, name: String },
    /// A property has the wrong type.
    WrongType {
        path: String,
        want: &'static str,
        got: &'static str,
    },
}

impl Violation {
    /// The offending field's name (or path), for messages that name the field.
    pub fn field(&self) -> String {
        match self {
            Self::Unknown { name, .. } | Self::Missing { name, .. } => name.clone(),
            Self::WrongType { path, .. } => path.trim_start_matches("$.").to_string(),
        }
    }
}

/// Checks `value` against an object shape; returns every violation found.
pub fn check(value: &Value, fields: &'static [Field]) -> Vec<Violation> {
    let mut out = Vec::new();
    check_at("$", value, Ty::Obj(fields), &mut out);
    out
}

fn check_at(path: &str, value: &Value, ty: Ty, out: &mut Vec<Violation>) {
    let ok = match (ty, value) {
        (Ty::Any, _) | (Ty::Str, Value::String(_)) | (Ty::Bool, Value::Bool(_)) => true,
        (Ty::Num, Value::Number(_)) => true,
        (Ty::Int, Value::Number(n)) => n.is_i64() || n.is_u64(),
        (Ty::StrList, Value::Array(items)) => items.iter().all(Value::is_string),
        (Ty::StrMap, Value::Object(map)) => map.values().all(Value::is_string),
        (Ty::Obj(fields), Value::Object(map)) => {
            check_object(path, map, fields, out);
            true
        }
        (Ty::ObjList(fields), Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                check_at(&format!("{path}[{i}]"), item, Ty::Obj(fields), out);
            }
            true
        }
        _ => false,
    };
    if !ok {
        out.push(Violation::WrongType {
            path: path.to_string(),
            want: want(ty),
            got: got(value),
        });
    }
}

fn check_object(
    path: &str,
    map: &serde_json::Map<String, Value>,
    fields: &[Field],
    out: &mut Vec<Violation>,
) {
    for name in map.keys() {
        if !fields.iter().any(|f| f.name == name) {
            out.push(Violation::Unknown {
                path: path.to_string(),
                name: name.clone(),
            });
        }
    }
    for field in fields {
        match map.get(field.name) {
            Some(Value::Null) if !field.required => {}
            Some(v) => check_at(&format!("{path}.{}", field.name), v, field.ty, out),
            None if field.required => out.push(Violation::Missing {
                path: path.to_string(),
                name: field.name.to_string(),
            }),
            None => {}
        }
    }
}

fn want(ty: Ty) -> &'static str {
    match ty {
        Ty::Str => "string",
        Ty::Int => "integer",
        Ty::Num => "number",
        Ty::Bool => "boolean",
        Ty::StrList | Ty::ObjList(_) => "array",
        Ty::StrMap | Ty::Obj(_) => "object",
        Ty::Any => "any",
    }
}

fn got(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const INNER: &[Field] = &[req("id", Ty::Str), opt("count", Ty::Int)];
    const OUTER: &[Field] = &[req("name", Ty::Str), opt("gpu", Ty::Obj(INNER))];

    #[test]
    fn unknown_missing_and_mistyped_properties_are_each_reported_with_their_path() {
        let body = json!({"bogus": 1, "gpu": {"id": "x", "count": "2"}});
        let found = check(&body, OUTER);
        assert!(found.contains(&Violation::Unknown {
            path: "$".into(),
            name: "bogus".into()
        }));
        assert!(found.contains(&Violation::Missing {
            path: "$".into(),
            name: "name".into()
        }));
        let wrong = Violation::WrongType {
            path: "$.gpu.count".into(),
            want: "integer",
            got: "string",
        };
        assert!(found.contains(&wrong));
        assert_eq!(found.len(), 3);
    }

    #[test]
    fn a_body_that_fits_the_shape_has_no_violations() {
        assert!(check(&json!({"name": "a", "gpu": {"id": "x"}}), OUTER).is_empty());
    }
}
