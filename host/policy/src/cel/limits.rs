//! Budgets for CEL expressions: how long, how deep and how costly an expression may be, how
//! long one evaluation may run, and how big the compiler's stack is.

use std::time::Duration;

/// Limits applied when an expression loads and when it runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CelLimits {
    /// Longest accepted source, in bytes.
    pub max_source_len: usize,
    /// Deepest accepted nesting, both of brackets in the source and of the parsed tree.
    pub max_nesting_depth: usize,
    /// Highest accepted worst-case cost estimate: one unit per node of the expression, with
    /// the body of a comprehension (`all`, `exists`, `map`, ...) counted `max_list_len` times.
    pub max_cost: u64,
    /// The list size assumed by the cost estimate; longer input lists are refused at run time.
    pub max_list_len: usize,
    /// Wall-clock budget of one evaluation, and of one batch. The interpreter checks it at every
    /// variable reference (inside comprehensions too) and a batch between offers; a typed
    /// evaluation is loop-free (at most one step per node) and is only checked between offers.
    pub eval_deadline: Duration,
    /// Stack of the thread the parser runs on. The ANTLR parser recurses deeply.
    pub compile_stack_bytes: usize,
    /// Compiled programs kept in the cache; when full, new programs are compiled but not cached.
    pub max_cached_programs: usize,
}

impl Default for CelLimits {
    fn default() -> Self {
        CelLimits {
            max_source_len: 4096,
            max_nesting_depth: 32,
            max_cost: 1_000_000,
            max_list_len: 1_000,
            eval_deadline: Duration::from_millis(100),
            compile_stack_bytes: 16 * 1024 * 1024,
            max_cached_programs: 4096,
        }
    }
}
