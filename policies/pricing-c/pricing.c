// Pricing policy in C, world neocloud:policy/pricing-policy@0.1.0.
//
// Rejects an offer priced above the workload's maximum. Otherwise accepts it with the workload's
// maximum as the price cap (or 120% of the offer's price when the workload sets none) and, for a
// spot offer, bids 110% of the current price, never above the cap nor the on-demand reference.
// Logs one line per decision through the capability-gated `log` import, so it must be granted it.
#include <string.h>

#include "pricing_policy.h"

typedef exports_neocloud_policy_pricing_pricing_input_t input_t;
typedef exports_neocloud_policy_pricing_price_decision_t decision_t;

static double min2(double a, double b) { return a < b ? a : b; }

static void say(const char *text) {
  pricing_policy_string_t message;
  pricing_policy_string_set(&message, text);
  neocloud_policy_log_log(NEOCLOUD_POLICY_LOG_LEVEL_DEBUG, &message);
}

// Appends `value` with two decimals (no stdio: printf would pull in WASI imports).
static char *put_price(char *at, double value) {
  unsigned long cents = (unsigned long)(value * 100.0 + 0.5);
  char digits[24];
  int n = 0;
  do {
    digits[n++] = (char)('0' + cents % 10);
    cents /= 10;
  } while (cents > 0 || n < 3);
  while (n > 2) *at++ = digits[--n];
  *at++ = '.';
  *at++ = digits[1];
  *at++ = digits[0];
  return at;
}

static char *put_text(char *at, const char *text) {
  size_t len = strlen(text);
  memcpy(at, text, len);
  return at + len;
}

static void reject(decision_t *ret, double price, double max) {
  static char reason[128];
  char *at = put_text(reason, "price ");
  at = put_price(at, price);
  at = put_text(at, " is above the maximum ");
  at = put_price(at, max);
  *at = '\0';
  ret->tag = EXPORTS_NEOCLOUD_POLICY_PRICING_PRICE_DECISION_REJECT;
  pricing_policy_string_dup(&ret->val.reject, reason);
  say("reject");
}

bool exports_neocloud_policy_pricing_price(input_t *input, decision_t *ret,
                                           exports_neocloud_policy_pricing_policy_error_t *err) {
  (void)err;
  double price = input->offer.price_per_hour;
  pricing_policy_option_f64_t max = input->workload.max_price_per_hour;
  if (max.is_some && price > max.val) {
    reject(ret, price, max.val);
    return true;
  }
  double cap = max.is_some ? max.val : price * 1.2;
  ret->tag = EXPORTS_NEOCLOUD_POLICY_PRICING_PRICE_DECISION_ACCEPT;
  ret->val.accept.max_price_per_hour = cap;
  ret->val.accept.spot_bid_per_hour.is_some = input->offer.spot;
  if (input->offer.spot) {
    double bid = min2(price * 1.1, cap);
    if (input->on_demand_reference.is_some) bid = min2(bid, input->on_demand_reference.val);
    ret->val.accept.spot_bid_per_hour.val = bid;
  }
  say("accept");
  return true;
}
