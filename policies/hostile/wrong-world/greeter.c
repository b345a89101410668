// Hostile guest for the wrong world (hostile:wrong/greeter-world): exports `greeter`, none of
// the neocloud:policy roles. The host must refuse it at load.
#include "greeter_world.h"

void exports_hostile_wrong_greeter_greet(greeter_world_string_t *name, greeter_world_string_t *ret) {
  greeter_world_string_dup(ret, "hello");
  greeter_world_string_free(name);
}
