// Hostile placement guest: allocates and touches 1 MiB blocks, keeping every one reachable from
// a global list (so the optimiser cannot elide them), until something stops it. The memory
// limiter must refuse the growth and trap.
#include <stdlib.h>

#include "placement_policy.h"

#define BLOCK (1u << 20)

struct block {
  struct block *next;
};

struct block *volatile kept = NULL;

bool exports_neocloud_policy_placement_place(
    exports_neocloud_policy_placement_placement_input_t *input,
    exports_neocloud_policy_placement_placement_decision_t *ret,
    exports_neocloud_policy_placement_policy_error_t *err) {
  (void)input;
  (void)ret;
  (void)err;
  for (;;) {
    volatile char *bytes = malloc(BLOCK);
    if (bytes == NULL) __builtin_trap();  // reached only if growth failed without a trap
    for (size_t page = 0; page < BLOCK; page += 4096) bytes[page] = 1;
    struct block *b = (struct block *)bytes;
    b->next = kept;
    kept = b;
  }
}
