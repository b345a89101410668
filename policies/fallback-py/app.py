# Fallback policy in Python (componentize-py), world neocloud:policy/fallback-policy@0.1.0.
# The same rules as the JavaScript fallback policy (policies/fallback-js/fallback.js), so the two
# can be compared and pass the same fixtures (policies/fallback-js/fixtures.yaml):
# - auth, quota, invalid-request: the provider will keep refusing; skip it.
# - rate-limited: retry the same offer with exponential backoff (1 s doubling, at most 60 s).
# - transient, timeout: retry the same offer up to 3 times in a row, then move on.
# - capacity, price-exceeded, preempted, lost: try the next offer, or re-plan in 30 s if none.
# - preempted a second time: give up. The node asks about a reclaim only for a gang member: the
#   first reclaim replaces the member, the second ends the whole gang.
# - more than 20 attempts or 30 minutes: give up with a reason.
# Its one import is the node's log; componentize-py's WASI imports are denied by the node.

import wit_world
from componentize_py_types import Err
from wit_world.exports import fallback
from wit_world.imports import log
from wit_world.imports.types import ErrorCode, FailureClass, PolicyError

MAX_ATTEMPTS = 20
MAX_ELAPSED_MS = 30 * 60 * 1000
MAX_SAME_RETRIES = 3
MAX_RECLAIMS = 2

SKIP = {FailureClass.AUTH, FailureClass.QUOTA, FailureClass.INVALID_REQUEST}
RETRY = {FailureClass.TRANSIENT, FailureClass.TIMEOUT}


def same_offer_streak(attempts):
    last = attempts[-1]
    streak = 0
    for a in reversed(attempts):
        if a.provider != last.provider or a.offer_id != last.offer_id:
            break
        streak += 1
    return streak


def move_on(inp):
    if inp.remaining_offers > 0:
        return fallback.FallbackAction_NextOffer()
    return fallback.FallbackAction_Wait(30000)


def decide(inp):
    attempts = inp.attempts
    last = attempts[-1]
    if len(attempts) > MAX_ATTEMPTS:
        return fallback.FallbackAction_GiveUp(f"gave up after {len(attempts)} attempts")
    if inp.elapsed_ms > MAX_ELAPSED_MS:
        return fallback.FallbackAction_GiveUp(f"gave up after {inp.elapsed_ms // 1000} s")
    if last.failure in SKIP:
        return fallback.FallbackAction_SkipProvider(last.provider)
    if last.failure == FailureClass.RATE_LIMITED:
        n = min(same_offer_streak(attempts) - 1, 6)
        return fallback.FallbackAction_RetrySame(min(1000 * 2**n, 60000))
    if last.failure in RETRY:
        if same_offer_streak(attempts) <= MAX_SAME_RETRIES:
            return fallback.FallbackAction_RetrySame(2000)
        return move_on(inp)
    if last.failure == FailureClass.PREEMPTED:
        reclaims = sum(1 for a in attempts if a.failure == FailureClass.PREEMPTED)
        if reclaims >= MAX_RECLAIMS:
            return fallback.FallbackAction_GiveUp(
                f"reclaimed {MAX_RECLAIMS} times: ending the gang"
            )
    return move_on(inp)


class Fallback(wit_world.exports.Fallback):
    def next(self, input: fallback.FallbackInput) -> fallback.FallbackAction:
        if not input.attempts:
            raise Err(PolicyError(ErrorCode.INVALID_INPUT, "fallback called with no attempts"))
        action = decide(input)
        log.log(log.Level.DEBUG, f"after {len(input.attempts)} attempts: {type(action).__name__}")
        return action
