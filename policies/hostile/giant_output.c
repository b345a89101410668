// Hostile placement guest: answers with 1 million scores (8 MiB) whatever the input. The host
// must reject the answer (it is not aligned with the offers) instead of using it.
#include <stdlib.h>

#include "placement_policy.h"

#define GIANT (1000u * 1000u)

bool exports_neocloud_policy_placement_place(
    exports_neocloud_policy_placement_placement_input_t *input,
    exports_neocloud_policy_placement_placement_decision_t *ret,
    exports_neocloud_policy_placement_policy_error_t *err) {
  (void)input;
  (void)err;
  double *scores = malloc(GIANT * sizeof(double));
  if (scores == NULL) __builtin_trap();
  for (size_t i = 0; i < GIANT; i++) scores[i] = (double)i;
  ret->tag = EXPORTS_NEOCLOUD_POLICY_PLACEMENT_PLACEMENT_DECISION_SCORES;
  ret->val.scores.ptr = scores;
  ret->val.scores.len = GIANT;
  return true;
}
