// Hostile placement guest: traps at once (`unreachable`).
#include "placement_policy.h"

bool exports_neocloud_policy_placement_place(
    exports_neocloud_policy_placement_placement_input_t *input,
    exports_neocloud_policy_placement_placement_decision_t *ret,
    exports_neocloud_policy_placement_policy_error_t *err) {
  (void)input;
  (void)ret;
  (void)err;
  __builtin_trap();
}
