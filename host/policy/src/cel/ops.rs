//! The static typing of CEL operators and of the functions the checker knows, as the `cel`
//! crate 0.15 evaluates them: the result type of a call, or why its operand types can never
//! work.
//!
//! Only what is certain to fail when it runs is refused. int, uint and double do not mix in
//! arithmetic (`48 / 0.4` fails), but they compare across types (`1 < 2.0` is true), and `==`
//! between values of different types is false, not an error, so equality is never refused.
//! An operand whose type is not known before evaluation (`dyn`) is never refused.
//!
//! Not the tree walk (see [`super::check`]) and not a full CEL type-checker.

use cel::common::ast::operators as op;

use super::schema::Ty;

/// Why a call's operand types can never work, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// What is wrong, e.g. "`/` is not defined for int and double".
    pub problem: String,
    /// How to fix it.
    pub hint: String,
    /// The operand the hint is about (an index into the call's operands), if one.
    pub operand: Option<usize>,
    /// The conversion the hint wraps that operand in, if it does.
    pub wrap_in: Option<&'static str>,
}

/// The result type of calling `name` (with a receiver when `member`) on operands of types
/// `args` (the receiver first), or why it cannot succeed.
pub(crate) fn call_type(name: &str, member: bool, args: &[Ty]) -> Result<Ty, Refusal> {
    match (name, args) {
        (op::ADD | op::SUBSTRACT | op::MULTIPLY | op::DIVIDE | op::MODULO, [a, b]) => {
            arithmetic(name, *a, *b)
        }
        (op::NEGATE, [a]) => match a {
            Ty::Int | Ty::Double | Ty::Dyn => Ok(*a),
            _ => Err(refuse(
                format!("`-` is not defined for {}", a.name()),
                "negate an int or a double",
                Some(0),
            )),
        },
        (op::LESS | op::LESS_EQUALS | op::GREATER | op::GREATER_EQUALS, [a, b]) => {
            ordering(name, *a, *b)
        }
        (op::LOGICAL_AND | op::LOGICAL_OR | op::LOGICAL_NOT, _) => logical(name, args),
        (op::CONDITIONAL, [c, a, b]) => conditional(*c, *a, *b),
        (op::IN, [_, container]) => membership(*container),
        ("startsWith" | "endsWith" | "matches", [target, arg]) if member => {
            string_test(name, *target, *arg)
        }
        ("size", [a]) => size(*a),
        _ => Ok(result_type(name, args)),
    }
}

fn refuse(problem: String, hint: &str, operand: Option<usize>) -> Refusal {
    Refusal {
        problem,
        hint: hint.to_owned(),
        operand,
        wrap_in: None,
    }
}

fn known(t: Ty) -> bool {
    t != Ty::Dyn
}

/// `+ - * / %`: both sides of the same numeric type (`+` also joins strings and lists).
fn arithmetic(name: &str, a: Ty, b: Ty) -> Result<Ty, Refusal> {
    let symbol = symbol(name);
    let joins = name == op::ADD;
    let ok = match (a, b) {
        (Ty::Int, Ty::Int) => true,
        (Ty::Double, Ty::Double) => name != op::MODULO,
        (Ty::String, Ty::String) | (Ty::ListString, Ty::ListString) => joins,
        (Ty::ListAttempt, Ty::ListAttempt) => joins,
        _ => !known(a) || !known(b),
    };
    if ok {
        return Ok(if a == b { a } else { Ty::Dyn });
    }
    let problem = format!(
        "`{symbol}` is not defined for {} and {}",
        a.name(),
        b.name()
    );
    Err(match (a, b) {
        (Ty::Int, Ty::Double) if name != op::MODULO => mixed(&problem, 0),
        (Ty::Double, Ty::Int) if name != op::MODULO => mixed(&problem, 1),
        _ if name == op::MODULO => {
            refuse(problem, "`%` takes two ints; use int() on a double", None)
        }
        _ if joins => refuse(
            problem,
            "`+` adds two ints or two doubles, or joins two strings or two lists",
            None,
        ),
        _ => refuse(problem, "both sides must be ints or both doubles", None),
    })
}

/// int and double do not mix in arithmetic: the int side is converted.
fn mixed(problem: &str, int_side: usize) -> Refusal {
    Refusal {
        problem: format!("{problem} (CEL does not convert between them in arithmetic)"),
        hint: "wrap the int side in double()".to_owned(),
        operand: Some(int_side),
        wrap_in: Some("double"),
    }
}

/// `< <= > >=`: numbers compare across int and double; strings with strings, bools with bools.
fn ordering(name: &str, a: Ty, b: Ty) -> Result<Ty, Refusal> {
    let ok = match (a, b) {
        _ if !known(a) || !known(b) => true,
        _ if a.is_number() && b.is_number() => true,
        (Ty::String, Ty::String) | (Ty::Bool, Ty::Bool) => true,
        _ => false,
    };
    if ok {
        return Ok(Ty::Bool);
    }
    let problem = format!(
        "`{}` cannot order {} and {}",
        symbol(name),
        a.name(),
        b.name()
    );
    Err(refuse(
        problem,
        "compare two numbers, two strings or two bools; convert one side with int(), double() or string()",
        None,
    ))
}

/// `&& || !`: every known operand must be a bool.
fn logical(name: &str, args: &[Ty]) -> Result<Ty, Refusal> {
    match args.iter().position(|t| known(*t) && *t != Ty::Bool) {
        None => Ok(Ty::Bool),
        Some(i) => Err(refuse(
            format!(
                "`{}` needs bool operands, not {}",
                symbol(name),
                args[i].name()
            ),
            "compare the value to make it a bool, e.g. `offer.price_per_hour > 0.0`",
            Some(i),
        )),
    }
}

fn conditional(c: Ty, a: Ty, b: Ty) -> Result<Ty, Refusal> {
    if known(c) && c != Ty::Bool {
        let problem = format!("the condition of `? :` must be a bool, not {}", c.name());
        return Err(refuse(
            problem,
            "compare the value to make it a bool",
            Some(0),
        ));
    }
    Ok(if a == b { a } else { Ty::Dyn })
}

/// `x in c`: `c` must be a list or a map.
fn membership(container: Ty) -> Result<Ty, Refusal> {
    match container {
        Ty::Int | Ty::Double | Ty::Bool | Ty::String => Err(refuse(
            format!(
                "`in` needs a list or a map on its right, not {}",
                container.name()
            ),
            "for a substring, use `s.contains(\"x\")`",
            Some(1),
        )),
        _ => Ok(Ty::Bool),
    }
}

/// `s.startsWith(p)`, `s.endsWith(p)`, `s.matches(re)`: two strings.
fn string_test(name: &str, target: Ty, arg: Ty) -> Result<Ty, Refusal> {
    let bad = [target, arg]
        .iter()
        .position(|t| known(*t) && *t != Ty::String);
    match bad {
        None => Ok(Ty::Bool),
        Some(i) => Err(refuse(
            format!("`{name}` needs strings, not {}", [target, arg][i].name()),
            "convert the value with string()",
            Some(i),
        )),
    }
}

fn size(a: Ty) -> Result<Ty, Refusal> {
    match a {
        Ty::Int | Ty::Double | Ty::Bool => Err(refuse(
            format!("`size` is not defined for {}", a.name()),
            "size() counts the characters of a string or the entries of a list or a map",
            Some(0),
        )),
        _ => Ok(Ty::Int),
    }
}

/// The result type of the calls that cannot be refused from their operand types.
fn result_type(name: &str, args: &[Ty]) -> Ty {
    match (name, args) {
        (op::EQUALS | op::NOT_EQUALS | op::NOT_STRICTLY_FALSE, _) => Ty::Bool,
        ("contains" | "matches" | "startsWith" | "endsWith", _) => Ty::Bool,
        (op::INDEX, [Ty::MapString | Ty::ListString, _]) => Ty::String,
        (op::INDEX, [Ty::ListAttempt, _]) => Ty::Attempt,
        ("int", _) => Ty::Int,
        ("double", _) => Ty::Double,
        ("string", _) => Ty::String,
        ("bool", _) => Ty::Bool,
        _ => Ty::Dyn,
    }
}

/// How an operator is written.
fn symbol(name: &str) -> &str {
    match name {
        op::ADD => "+",
        op::SUBSTRACT => "-",
        op::MULTIPLY => "*",
        op::DIVIDE => "/",
        op::MODULO => "%",
        op::LESS => "<",
        op::LESS_EQUALS => "<=",
        op::GREATER => ">",
        op::GREATER_EQUALS => ">=",
        op::LOGICAL_AND => "&&",
        op::LOGICAL_OR => "||",
        op::LOGICAL_NOT => "!",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use cel::parser::Parser;

    use super::super::check::Checker;
    use super::super::error::{CelError, ExprKind};
    use super::super::limits::CelLimits;

    /// Whether the checker refuses `src` for a type mismatch.
    fn refused_at_load(src: &str) -> bool {
        let (expr, info) = Parser::new().parse_with_source_info(src).unwrap();
        let limits = CelLimits::default();
        match Checker::new(ExprKind::Constraint, &info, &limits).check(&expr, 0) {
            Ok(_) => false,
            Err(CelError::TypeMismatch { .. }) => true,
            Err(other) => panic!("{src}: {other}"),
        }
    }

    /// Whether the `cel` interpreter fails on `src`.
    fn fails_at_run_time(src: &str) -> bool {
        let program = cel::Program::compile(src).unwrap();
        program.execute(&cel::Context::default()).is_err()
    }

    #[test]
    fn load_refuses_exactly_the_operand_types_the_interpreter_fails_on() {
        let refused = [
            "48 / 0.4",
            "0.4 * 2",
            "1 + 2.0",
            "3.0 - 1",
            "5.0 % 2.0",
            "'a' < 1",
            "1.0 > 'b'",
            "'a' + 1",
            "1 && true",
            "false || 2.0",
            "!1",
            "1 ? 2 : 3",
            "'us' in 'us-east'",
            "'a'.startsWith(1)",
            "size(1)",
            "-'a'",
        ];
        let accepted = [
            "5 % 2",
            "1 < 2.0",
            "2.0 >= 1",
            "1 == 1.0",
            "'a' == 1",
            "'a' != true",
            "'a' < 'b'",
            "true < false",
            "'a' + 'b'",
            "'us' in ['us']",
            "'a'.startsWith('a')",
            "size('abc')",
            "-1.5",
        ];
        for (cases, fails) in [(&refused[..], true), (&accepted[..], false)] {
            for src in cases {
                assert_eq!(fails_at_run_time(src), fails, "`{src}` at run time");
                assert_eq!(refused_at_load(src), fails, "`{src}` at load");
            }
        }
    }
}
