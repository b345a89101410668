// Placement policy in C, world neocloud:policy/placement-policy@0.1.0.
//
// Scores every offer by value for money: reliability / price-per-hour, higher is better.
// An offer is excluded (score -1) when it has fewer GPUs than the workload asks for, a GPU model
// the workload does not accept, a price above the workload's maximum, the wrong capacity type
// (spot vs on-demand), or an unverified host. No offers at all is an `invalid-input` error.
// It imports nothing: no log, no WASI.
#include <stdlib.h>
#include <string.h>

#include "placement_policy.h"

typedef exports_neocloud_policy_placement_placement_input_t input_t;
typedef exports_neocloud_policy_placement_offer_t offer_t;
typedef exports_neocloud_policy_placement_workload_t workload_t;

static bool model_accepted(const workload_t *w, neocloud_policy_types_gpu_model_t model) {
  if (w->gpu_models.len == 0) return true;
  for (size_t i = 0; i < w->gpu_models.len; i++) {
    if (w->gpu_models.ptr[i] == model) return true;
  }
  return false;
}

static bool capacity_accepted(const workload_t *w, bool spot) {
  switch (w->capacity_type) {
    case NEOCLOUD_POLICY_TYPES_CAPACITY_TYPE_ON_DEMAND: return !spot;
    case NEOCLOUD_POLICY_TYPES_CAPACITY_TYPE_SPOT: return spot;
    default: return true;
  }
}

static bool eligible(const workload_t *w, const offer_t *o) {
  if (o->gpu_count < w->gpu_count) return false;
  if (!model_accepted(w, o->gpu_model)) return false;
  if (w->max_price_per_hour.is_some && o->price_per_hour > w->max_price_per_hour.val) return false;
  if (!capacity_accepted(w, o->spot)) return false;
  return o->verified && o->price_per_hour > 0.0;
}

static void fail(exports_neocloud_policy_placement_policy_error_t *err, const char *message) {
  err->code = NEOCLOUD_POLICY_TYPES_ERROR_CODE_INVALID_INPUT;
  placement_policy_string_dup(&err->message, message);  // freed by the post-return
}

bool exports_neocloud_policy_placement_place(
    input_t *input, exports_neocloud_policy_placement_placement_decision_t *ret,
    exports_neocloud_policy_placement_policy_error_t *err) {
  size_t n = input->offers.len;
  if (n == 0) {
    fail(err, "no offers to place");
    return false;
  }
  double *scores = malloc(n * sizeof(double));
  if (scores == NULL) {
    fail(err, "out of memory");
    return false;
  }
  for (size_t i = 0; i < n; i++) {
    const offer_t *o = &input->offers.ptr[i];
    scores[i] = eligible(&input->workload, o) ? o->reliability / o->price_per_hour : -1.0;
  }
  // The instance is thrown away after this call, so the input is not freed.
  ret->tag = EXPORTS_NEOCLOUD_POLICY_PLACEMENT_PLACEMENT_DECISION_SCORES;
  ret->val.scores.ptr = scores;
  ret->val.scores.len = n;
  return true;
}
