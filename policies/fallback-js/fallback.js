// Fallback policy in JavaScript (componentize-js), world neocloud:policy/fallback-policy@0.1.0.
//
// What it decides after a failed rental attempt:
// - auth, quota, invalid-request: the provider will keep refusing; skip it.
// - rate-limited: retry the same offer with exponential backoff (1 s doubling, at most 60 s).
// - transient, timeout: retry the same offer up to 3 times in a row, then move on.
// - capacity, price-exceeded, preempted, lost: try the next offer, or re-plan in 30 s if none.
// - preempted a second time: give up. The node asks about a reclaim only for a gang member
//   (docs/OPERATIONS.md, "Gangs"): the first reclaim replaces the member, the second ends the
//   whole gang.
// - more than 20 attempts or 30 minutes: give up with a reason.
// Built with every componentize-js feature disabled, so it imports nothing from the host.

const MAX_ATTEMPTS = 20;
const MAX_ELAPSED_MS = 30 * 60 * 1000;
const MAX_SAME_RETRIES = 3;
const MAX_RECLAIMS = 2;

function sameOfferStreak(attempts) {
  const last = attempts[attempts.length - 1];
  let streak = 0;
  for (let i = attempts.length - 1; i >= 0; i--) {
    const a = attempts[i];
    if (a.provider !== last.provider || a.offerId !== last.offerId) break;
    streak++;
  }
  return streak;
}

function moveOn(input) {
  if (input.remainingOffers > 0) return { tag: 'next-offer' };
  return { tag: 'wait', val: 30000 };
}

function decide(input) {
  const attempts = input.attempts;
  const last = attempts[attempts.length - 1];
  if (attempts.length > MAX_ATTEMPTS) {
    return { tag: 'give-up', val: `gave up after ${attempts.length} attempts` };
  }
  if (input.elapsedMs > BigInt(MAX_ELAPSED_MS)) {
    return { tag: 'give-up', val: `gave up after ${input.elapsedMs / 1000n} s` };
  }
  switch (last.failure) {
    case 'auth':
    case 'quota':
    case 'invalid-request':
      return { tag: 'skip-provider', val: last.provider };
    case 'rate-limited': {
      const n = Math.min(sameOfferStreak(attempts) - 1, 6);
      return { tag: 'retry-same', val: Math.min(1000 * 2 ** n, 60000) };
    }
    case 'transient':
    case 'timeout':
      if (sameOfferStreak(attempts) <= MAX_SAME_RETRIES) return { tag: 'retry-same', val: 2000 };
      return moveOn(input);
    case 'preempted':
      if (attempts.filter((a) => a.failure === 'preempted').length >= MAX_RECLAIMS) {
        return { tag: 'give-up', val: `reclaimed ${MAX_RECLAIMS} times: ending the gang` };
      }
      return moveOn(input);
    default:
      return moveOn(input);
  }
}

export const fallback = {
  next(input) {
    if (input.attempts.length === 0) {
      // An `err` result: componentize-js turns a thrown `{ payload }` into the error case.
      const err = new Error('no attempt to handle');
      err.payload = { code: 'invalid-input', message: 'fallback called with no attempts' };
      throw err;
    }
    return decide(input);
  },
};
