// Fallback policy in JavaScript built WITH componentize-js's stdio, random and clocks features,
// so it imports WASI 0.2 (cli, io, clocks, random). It exists to test the host's deny-all WASI
// context: it loads only when granted that context, and what it prints lands in the bounded log.
export const fallback = {
  next(input) {
    console.log(`fallback after ${input.attempts.length} attempt(s)`);
    return input.remainingOffers > 0 ? { tag: 'next-offer' } : { tag: 'wait', val: 1000 };
  },
};
