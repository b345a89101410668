//! The Vast.ai query language as the REST API receives it: `{"column": {"op": value}}` with
//! `eq neq gt gte lt lte in notin` (and the CLI spellings `= == != > >= < <= nin`), used by offer
//! search (`POST /api/v0/bundles/`) and by `select_filters` on the instance list.
//!
//! Not the CLI's string form (`gpu_name=RTX_4090 num_gpus>=1`): clients translate that
//! themselves before calling the API.

use std::cmp::Ordering;

use serde_json::{Map, Value};

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Op {
    Eq,
    Neq,
    Gt,
    Gte,
    Lt,
    Lte,
    In,
    NotIn,
}

impl Op {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "eq" | "=" | "==" => Self::Eq,
            "neq" | "!=" => Self::Neq,
            "gt" | ">" => Self::Gt,
            "gte" | ">=" => Self::Gte,
            "lt" | "<" => Self::Lt,
            "lte" | "<=" => Self::Lte,
            "in" => Self::In,
            "notin" | "nin" => Self::NotIn,
            _ => return None,
        })
    }
}

/// One `column op value` condition.
#[derive(Debug, Clone)]
pub(crate) struct Condition {
    column: String,
    op: Op,
    value: Value,
}

/// Parses the filter entries of `object` whose keys are in `columns`; `skip` lists keys that are
/// not filters (e.g. `order`, `limit`). Errors name the offending field.
pub(crate) fn parse(
    object: &Map<String, Value>,
    columns: &[&str],
    skip: &[&str],
) -> Result<Vec<Condition>, String> {
    let mut conditions = Vec::new();
    for (column, spec) in object
        .iter()
        .filter(|(key, _)| !skip.contains(&key.as_str()))
    {
        if !columns.contains(&column.as_str()) {
            return Err(format!("unknown field '{column}'"));
        }
        let Value::Object(ops) = spec else {
            return Err(format!(
                "field '{column}' must be an object like {{\"eq\": value}}"
            ));
        };
        for (op, value) in ops {
            let op =
                Op::parse(op).ok_or_else(|| format!("unknown operator '{op}' on '{column}'"))?;
            if matches!(op, Op::In | Op::NotIn) && !value.is_array() {
                return Err(format!("operator on '{column}' needs a list"));
            }
            if value.as_str().is_some_and(|v| v == "any" || v == "*") {
                continue;
            }
            conditions.push(Condition {
                column: column.clone(),
                op,
                value: value.clone(),
            });
        }
    }
    Ok(conditions)
}

/// Whether a row satisfies every condition.
pub(crate) fn matches(row: &Value, conditions: &[Condition]) -> bool {
    conditions.iter().all(|condition| holds(row, condition))
}

fn holds(row: &Value, condition: &Condition) -> bool {
    let actual = candidates(row, &condition.column);
    let any = |pred: &dyn Fn(&Value) -> bool| actual.iter().any(pred);
    match condition.op {
        Op::Eq => any(&|a| compare(a, &condition.value) == Some(Ordering::Equal)),
        Op::Neq => !any(&|a| compare(a, &condition.value) == Some(Ordering::Equal)),
        Op::Gt => any(&|a| compare(a, &condition.value) == Some(Ordering::Greater)),
        Op::Gte => any(&|a| compare(a, &condition.value).is_some_and(Ordering::is_ge)),
        Op::Lt => any(&|a| compare(a, &condition.value) == Some(Ordering::Less)),
        Op::Lte => any(&|a| compare(a, &condition.value).is_some_and(Ordering::is_le)),
        Op::In => any(&|a| in_list(a, &condition.value)),
        Op::NotIn => !any(&|a| in_list(a, &condition.value)),
    }
}

/// The values a column offers for comparison: `geolocation` ("City, CC") also matches its
/// country code.
fn candidates(row: &Value, column: &str) -> Vec<Value> {
    let value = row.get(column).cloned().unwrap_or(Value::Null);
    match (column, value.as_str()) {
        ("geolocation", Some(text)) => {
            let code = text.rsplit(", ").next().unwrap_or(text).to_string();
            vec![value.clone(), Value::String(code)]
        }
        _ => vec![value],
    }
}

fn in_list(actual: &Value, list: &Value) -> bool {
    list.as_array().is_some_and(|items| {
        items
            .iter()
            .any(|item| compare(actual, item) == Some(Ordering::Equal))
    })
}

fn compare(actual: &Value, wanted: &Value) -> Option<Ordering> {
    match (actual, wanted) {
        (Value::Number(a), Value::Number(b)) => a.as_f64()?.partial_cmp(&b.as_f64()?),
        (Value::String(a), Value::String(b)) => Some(a.cmp(b)),
        (Value::Bool(a), Value::Bool(b)) => Some(a.cmp(b)),
        (Value::Null, Value::Null) => Some(Ordering::Equal),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const COLUMNS: &[&str] = &[
        "gpu_name",
        "num_gpus",
        "dph_total",
        "geolocation",
        "verified",
    ];

    fn filter(query: &Value) -> Vec<Condition> {
        parse(query.as_object().unwrap(), COLUMNS, &["order"]).unwrap()
    }

    #[test]
    fn numeric_list_and_country_conditions_all_have_to_hold() {
        let row = json!({"gpu_name": "RTX 4090", "num_gpus": 2, "dph_total": 0.5,
                         "geolocation": "Austin, US", "verified": true});
        let hit = filter(&json!({"gpu_name": {"in": ["RTX 4090", "H100 SXM"]},
            "num_gpus": {">=": 2}, "dph_total": {"lte": 0.5}, "geolocation": {"in": ["US", "CA"]},
            "verified": {"eq": true}, "order": [["dph_total", "asc"]]}));
        assert!(matches(&row, &hit));
        assert!(!matches(&row, &filter(&json!({"dph_total": {"lt": 0.5}}))));
        assert!(!matches(
            &row,
            &filter(&json!({"geolocation": {"notin": ["US"]}}))
        ));
    }

    #[test]
    fn unknown_columns_and_operators_are_rejected_by_name() {
        let unknown = parse(
            json!({"bogus": {"eq": 1}}).as_object().unwrap(),
            COLUMNS,
            &[],
        );
        assert_eq!(unknown.unwrap_err(), "unknown field 'bogus'");
        let op = parse(
            json!({"num_gpus": {"like": 1}}).as_object().unwrap(),
            COLUMNS,
            &[],
        );
        assert!(op.unwrap_err().contains("'like'"));
    }
}
