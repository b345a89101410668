// Hostile placement guest: recurses without end. The call goes through a volatile function
// pointer so the optimiser can neither remove the recursion nor turn it into a loop, and it keeps
// no locals in linear memory, so it exhausts the Wasm stack (not the C shadow stack). The Wasm
// stack limit must stop it.
#include "placement_policy.h"

static uint64_t descend(uint64_t depth);
static uint64_t (*volatile next)(uint64_t) = descend;

static uint64_t descend(uint64_t depth) { return next(depth + 1) * 3 + depth; }

bool exports_neocloud_policy_placement_place(
    exports_neocloud_policy_placement_placement_input_t *input,
    exports_neocloud_policy_placement_placement_decision_t *ret,
    exports_neocloud_policy_placement_policy_error_t *err) {
  (void)ret;
  (void)err;
  return next(input->offers.len) == 0;
}
