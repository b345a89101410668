// Placement policy in JavaScript (componentize-js), world neocloud:policy/placement-policy@0.1.0.
// The same rules as the C placement policy (policies/placement-c/placement.c), so the two can be
// benchmarked against each other: reliability / price-per-hour for eligible offers, -1 otherwise.

function eligible(w, o) {
  if (o.gpuCount < w.gpuCount) return false;
  if (w.gpuModels.length > 0 && !w.gpuModels.includes(o.gpuModel)) return false;
  if (w.maxPricePerHour !== undefined && w.maxPricePerHour !== null && o.pricePerHour > w.maxPricePerHour) return false;
  if (w.capacityType === 'on-demand' && o.spot) return false;
  if (w.capacityType === 'spot' && !o.spot) return false;
  return o.verified && o.pricePerHour > 0;
}

export const placement = {
  place(input) {
    const offers = input.offers;
    if (offers.length === 0) {
      const err = new Error('no offers');
      err.payload = { code: 'invalid-input', message: 'no offers to place' };
      throw err;
    }
    const scores = new Float64Array(offers.length);
    for (let i = 0; i < offers.length; i++) {
      const o = offers[i];
      scores[i] = eligible(input.workload, o) ? o.reliability / o.pricePerHour : -1;
    }
    return { tag: 'scores', val: scores };
  },
};
