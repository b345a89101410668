// Hostile placement guest: never returns. The epoch deadline (or fuel) must stop it.
#include "placement_policy.h"

bool exports_neocloud_policy_placement_place(
    exports_neocloud_policy_placement_placement_input_t *input,
    exports_neocloud_policy_placement_placement_decision_t *ret,
    exports_neocloud_policy_placement_policy_error_t *err) {
  (void)ret;
  (void)err;
  volatile uint64_t spins = input->offers.len;
  for (;;) spins++;
}
