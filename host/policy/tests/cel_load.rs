//! What the CEL engine refuses or accepts when an expression loads.

mod cel_support;

use std::sync::Arc;

use neocloud_policy::cel::{CelEngine, CelError, CelLimits, ExprKind, Position};

fn engine() -> CelEngine {
    CelEngine::new(CelLimits::default())
}

fn at(line: u32, column: u32) -> Position {
    Position { line, column }
}

#[test]
fn unknown_identifier_is_refused_at_load_with_its_position() {
    let err = engine()
        .compile_constraint("offer.spot &&\n  ofer.price_per_hour < 2.0")
        .unwrap_err();
    let CelError::UnknownIdentifier { name, at: pos, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(name, "ofer");
    assert_eq!(*pos, at(2, 3));
    let message = err.to_string();
    assert!(
        message.contains("unknown identifier `ofer` at 2:3"),
        "{message}"
    );
    assert!(
        message.contains("workload, offer and attempts"),
        "{message}"
    );
}

#[test]
fn unknown_field_is_refused_at_load_with_the_known_fields() {
    let err = engine()
        .compile_constraint("offer.gpu.memory > 40")
        .unwrap_err();
    let CelError::UnknownField {
        field, on, known, ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!((field.as_str(), *on), ("memory", "gpu"));
    assert!(known.contains("memory_gib"), "{known}");
}

#[test]
fn comprehension_variables_are_declared_inside_their_comprehension_only() {
    let engine = engine();
    let ok = "attempts.exists(a, a.provider == offer.provider && a.failure_class == 'capacity')";
    assert!(!engine.compile_constraint(ok).unwrap().is_typed());
    let err = engine
        .compile_constraint("attempts.exists(a, true) && a.provider == 'x'")
        .unwrap_err();
    assert!(
        matches!(err, CelError::UnknownIdentifier { ref name, .. } if name == "a"),
        "{err}"
    );
    let err = engine
        .compile_constraint("attempts.all(a, a.provder != 'x')")
        .unwrap_err();
    assert!(
        matches!(err, CelError::UnknownField { on: "attempt", .. }),
        "{err}"
    );
}

#[test]
fn constraint_that_is_not_boolean_is_refused_with_the_expression_and_position() {
    let err = engine()
        .compile_constraint("offer.price_per_hour * 2.0")
        .unwrap_err();
    let CelError::WrongResultType {
        kind,
        found,
        expression,
        at: pos,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!((*kind, *found), (ExprKind::Constraint, "double"));
    assert_eq!(expression, "offer.price_per_hour * 2.0");
    assert_eq!(*pos, at(1, 22));
    assert!(
        err.to_string()
            .contains("must return bool but returns double at 1:22"),
        "{err}"
    );
}

#[test]
fn rank_that_is_not_a_number_is_refused_even_on_the_interpreted_path() {
    let engine = engine();
    let err = engine.compile_rank("offer.region").unwrap_err();
    assert!(
        matches!(
            err,
            CelError::WrongResultType {
                found: "string",
                ..
            }
        ),
        "{err}"
    );
    let err = engine
        .compile_rank("attempts.exists(a, a.provider == 'vast')")
        .unwrap_err();
    assert!(
        matches!(err, CelError::WrongResultType { found: "bool", .. }),
        "{err}"
    );
}

#[test]
fn source_over_the_length_limit_is_refused_with_both_lengths() {
    let limits = CelLimits {
        max_source_len: 64,
        ..CelLimits::default()
    };
    let src = format!("offer.region == '{}'", "x".repeat(60));
    let err = CelEngine::new(limits).compile_constraint(&src).unwrap_err();
    assert_eq!(
        err,
        CelError::SourceTooLong {
            kind: ExprKind::Constraint,
            len: src.len(),
            max: 64
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "constraint expression is {} bytes long, more than the limit of 64",
            src.len()
        )
    );
}

#[test]
fn brackets_nested_past_the_limit_are_refused_before_parsing() {
    let limits = CelLimits {
        max_nesting_depth: 8,
        ..CelLimits::default()
    };
    let src = format!("{}offer.spot{}", "(".repeat(9), ")".repeat(9));
    let err = CelEngine::new(limits).compile_constraint(&src).unwrap_err();
    let CelError::TooDeeplyNested { max, at: pos, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!((*max, *pos), (8, at(1, 9)));
    assert!(
        err.to_string()
            .contains("nests deeper than the limit of 8 at 1:9"),
        "{err}"
    );
}

#[test]
fn deep_operator_chains_without_brackets_are_refused_by_the_tree_depth() {
    let src = format!("offer.gpu_count{} > 3", " + 1".repeat(2000));
    let engine = CelEngine::new(CelLimits {
        max_source_len: 100_000,
        ..CelLimits::default()
    });
    let err = engine.compile_constraint(&src).unwrap_err();
    assert!(
        matches!(err, CelError::TooDeeplyNested { max: 32, .. }),
        "{err}"
    );
}

#[test]
fn brackets_inside_string_literals_do_not_count_as_nesting() {
    let limits = CelLimits {
        max_nesting_depth: 4,
        ..CelLimits::default()
    };
    let src = "offer.region != '((((((((((' && offer.id != \"[[[[[[[[\\\"[[[[\"";
    CelEngine::new(limits).compile_constraint(src).unwrap();
}

#[test]
fn syntax_error_is_refused_with_its_position() {
    let err = engine()
        .compile_constraint("offer.spot &&& true")
        .unwrap_err();
    let CelError::Parse { at: pos, .. } = &err else {
        panic!("{err}")
    };
    assert_eq!(pos.line, 1);
    assert!(
        err.to_string()
            .starts_with("failed to parse constraint expression at 1:"),
        "{err}"
    );
}

#[test]
fn expression_whose_worst_case_cost_is_over_the_limit_is_refused() {
    let limits = CelLimits {
        max_cost: 10_000,
        max_list_len: 100,
        ..CelLimits::default()
    };
    let src = "attempts.all(a, attempts.all(b, attempts.all(c, a.provider != c.provider)))";
    let err = CelEngine::new(limits).compile_constraint(src).unwrap_err();
    let CelError::TooExpensive { cost, max, .. } = err else {
        panic!("{err}")
    };
    assert!(cost > 1_000_000 && max == 10_000, "{cost}");
}

#[test]
fn second_compile_of_the_same_source_hits_the_cache() {
    let engine = engine();
    let first = engine
        .compile_constraint(cel_support::BENCH_CONSTRAINT)
        .unwrap();
    let second = engine
        .compile_constraint(cel_support::BENCH_CONSTRAINT)
        .unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(engine.compilations(), 1);
    engine.compile_rank(cel_support::BENCH_RANK).unwrap();
    engine.compile_rank(cel_support::BENCH_RANK).unwrap();
    assert_eq!(engine.compilations(), 2);
}

#[test]
fn the_same_source_is_cached_separately_per_kind() {
    let engine = engine();
    engine.compile_constraint("offer.gpu_count > 1").unwrap();
    let err = engine.compile_rank("offer.gpu_count > 1").unwrap_err();
    assert!(
        matches!(
            err,
            CelError::WrongResultType {
                kind: ExprKind::Rank,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn refused_sources_are_not_cached() {
    let engine = engine();
    engine.compile_constraint("nope").unwrap_err();
    engine.compile_constraint("nope").unwrap_err();
    assert_eq!(engine.compilations(), 2);
}

#[test]
fn benchmark_expressions_run_on_the_typed_path() {
    let engine = engine();
    assert!(
        engine
            .compile_constraint(cel_support::BENCH_CONSTRAINT)
            .unwrap()
            .is_typed()
    );
    assert!(
        engine
            .compile_rank(cel_support::BENCH_RANK)
            .unwrap()
            .is_typed()
    );
}

#[test]
fn positions_count_characters_not_bytes() {
    let err = engine()
        .compile_constraint("offer.region == 'é東' && ofer.spot")
        .unwrap_err();
    assert!(
        matches!(err, CelError::UnknownIdentifier { at: p, .. } if p == at(1, 25)),
        "{err}"
    );
}

#[test]
fn compiled_expressions_and_the_engine_can_be_shared_between_threads() {
    fn shareable<T: Send + Sync>(_: &T) {}
    let engine = Arc::new(engine());
    let compiled = engine
        .compile_constraint(cel_support::BENCH_CONSTRAINT)
        .unwrap();
    shareable(&engine);
    shareable(&compiled);
    let other = std::thread::spawn({
        let engine = Arc::clone(&engine);
        move || {
            engine
                .compile_constraint(cel_support::BENCH_CONSTRAINT)
                .unwrap()
        }
    });
    assert!(Arc::ptr_eq(&compiled, &other.join().unwrap()));
}

#[test]
fn int_and_double_mixed_in_arithmetic_are_refused_at_load_with_a_hint() {
    let err = engine()
        .compile_rank("offer.gpu.memory_gib / offer.price_per_hour")
        .unwrap_err();
    let CelError::TypeMismatch {
        kind,
        problem,
        hint,
        at: pos,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(*kind, ExprKind::Rank);
    assert_eq!(*pos, at(1, 22), "the operator's position");
    assert!(
        problem.contains("`/` is not defined for int and double"),
        "{problem}"
    );
    assert_eq!(
        hint,
        "wrap the int side in double(): double(offer.gpu.memory_gib)"
    );
    let err = engine()
        .compile_constraint("offer.price_per_hour * 2 < 3.0")
        .unwrap_err();
    assert!(
        err.to_string().contains("double(2)") && err.to_string().contains("at 1:22"),
        "{err}"
    );
}

#[test]
fn operands_that_can_never_work_are_refused_at_load_naming_the_operator() {
    let cases = [
        ("offer.region < 3", "`<` cannot order string and int"),
        (
            "offer.price_per_hour && offer.spot",
            "`&&` needs bool operands, not double",
        ),
        (
            "'us' in offer.region",
            "`in` needs a list or a map on its right, not string",
        ),
        (
            "offer.region.startsWith(1)",
            "`startsWith` needs strings, not int",
        ),
        (
            "offer.disk_gib % 2.0 == 0",
            "`%` is not defined for int and double",
        ),
        ("size(offer.gpu_count) > 0", "`size` is not defined for int"),
    ];
    for (src, problem) in cases {
        let err = engine().compile_constraint(src).unwrap_err();
        assert!(
            matches!(err, CelError::TypeMismatch { .. }) && err.to_string().contains(problem),
            "{src}: {err}"
        );
    }
}

#[test]
fn numbers_of_both_types_still_compare_and_converted_arithmetic_loads() {
    let engine = engine();
    for src in [
        "offer.gpu.memory_gib >= 40.0",
        "offer.price_per_hour < 2",
        "offer.gpu_count == 1.0",
        "offer.region == 1",
        "attempts.exists(a, a.provider == offer.provider) || size(attempts) < 3",
        "workload.annotations['team'] + '-x' == 'ml-x'",
        "'gold' in workload.annotations",
    ] {
        engine
            .compile_constraint(src)
            .unwrap_or_else(|e| panic!("{src}: {e}"));
    }
    for src in [
        "double(offer.gpu.memory_gib) / offer.price_per_hour",
        "offer.reliability * 10.0 - offer.price_per_hour",
        "offer.gpu.memory_gib * offer.gpu_count",
        "size(attempts) * 2",
    ] {
        engine
            .compile_rank(src)
            .unwrap_or_else(|e| panic!("{src}: {e}"));
    }
}
