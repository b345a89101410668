//! The market trace generator: a seeded week of prices, capacity, spot reclaims, rate limits and
//! capacity refusals for the three clouds, from parameters fixed here before any strategy was
//! compared (see `docs/REPLAY.md` for each one and its source).
//!
//! Prices start at each offer's list price and move by a mean-reverting random walk on the log
//! of the price plus a daily demand cycle, kept within a band around the list price; spot
//! minimum bids move the same way and never exceed the on-demand price. Each offer alternates
//! between periods with capacity and sold-out periods of exponentially distributed length.
//! Reclaims, rate-limit bursts and refusal bursts are Poisson processes.
//!
//! The generator uses ChaCha8 seeded from the seed, so a seed gives the same trace on every
//! machine and with every version of this crate that keeps these parameters.

use neocloud_cloudsim::{OfferConfig, Timing};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::trace::{Change, Cloud, Event, FORMAT, Header, Trace};

/// How one cloud's market behaves.
#[derive(Debug, Clone, Serialize)]
pub struct CloudParams {
    /// The cloud.
    pub cloud: Cloud,
    /// Boot and stop times.
    pub timing: Timing,
    /// Per-tick standard deviation of the log of on-demand prices (0: fixed list prices).
    pub on_demand_walk: f64,
    /// Per-tick standard deviation of the log of spot minimum bids.
    pub spot_walk: f64,
    /// Lowest and highest on-demand price, as multiples of the list price.
    pub on_demand_band: (f64, f64),
    /// Lowest and highest spot minimum bid, as multiples of its starting value.
    pub spot_band: (f64, f64),
    /// Mean hours an offer has capacity before it sells out.
    pub mean_available_h: f64,
    /// Mean hours an offer stays sold out.
    pub mean_sold_out_h: f64,
    /// Reclaims per day of each spot offer (every interruptible instance on it stops).
    pub reclaims_per_day: f64,
    /// Bursts of rate limiting (every request, 10 to 60 s) per day.
    pub rate_limit_bursts_per_day: f64,
    /// Bursts of capacity refusals on creates (5 to 30 min) per day.
    pub refusal_bursts_per_day: f64,
}

/// The whole generator's parameters.
#[derive(Debug, Clone, Serialize)]
pub struct MarketParams {
    /// Seconds of market time.
    pub duration_s: u64,
    /// Prices and capacity move every this many seconds.
    pub tick_s: u64,
    /// Amplitude of the daily demand cycle (prices highest at 16:00 UTC, lowest at 04:00).
    pub daily_swing: f64,
    /// Pull of a walked price back to its list price per tick (0..1).
    pub mean_reversion: f64,
    /// A price change smaller than this fraction is not written.
    pub min_change: f64,
    /// Per cloud.
    pub clouds: Vec<CloudParams>,
    /// The offers at time zero, per cloud, in the simulator's units (RunPod: per GPU).
    pub offers: Vec<(Cloud, OfferConfig)>,
}

/// Where the list prices come from.
pub const SOURCES: &str = "RunPod RTX 4090 0.44 (secure) and 0.31 (community) USD per GPU-hour \
    from the gpuTypes example in the reference provider-apis.md; every other list price is the \
    cloud simulators' default market (host/cloudsim/src/{runpod,lambda,vast}/mod.rs), which \
    follows the providers' public price pages; spot minimum bids start at the simulators' \
    ratios (RunPod per offer, Vast 0.6 of on-demand); Lambda has no spot market";

const HOUR: f64 = 3600.0;
const DAY: f64 = 86_400.0;

fn timing(provisioning_s: u64, starting_s: u64, terminating_s: u64) -> Timing {
    Timing {
        provisioning_ms: provisioning_s * 1000,
        starting_ms: starting_s * 1000,
        terminating_ms: terminating_s * 1000,
    }
}

#[allow(clippy::too_many_arguments)]
fn offer(
    id: u64,
    gpu: &str,
    gpu_count: u32,
    memory: u32,
    region: &str,
    cloud: Option<&str>,
    price: f64,
    spot: Option<f64>,
    capacity: u32,
    reliability: f64,
) -> OfferConfig {
    OfferConfig {
        id: Some(id),
        gpu: gpu.to_owned(),
        gpu_count,
        gpu_memory_gb: memory,
        region: region.to_owned(),
        price_per_hour: price,
        spot_price_per_hour: spot,
        capacity,
        reliability,
        cloud: cloud.map(str::to_owned),
        verified: true,
        vcpus: 8 * gpu_count,
        ram_gb: 32 * gpu_count,
        disk_gb: 200,
    }
}

fn vast_spot(price: f64) -> Option<f64> {
    Some((price * 0.6 * 1000.0).round() / 1000.0)
}

impl MarketParams {
    /// The parameters `make replay` uses: a week, with the markets described in
    /// `docs/REPLAY.md`.
    pub fn week() -> MarketParams {
        use Cloud::{Lambda, Runpod, Vast};
        let runpod = |id, gpu, mem, region, kind: &str, price, spot, capacity| {
            (
                Runpod,
                offer(
                    id,
                    gpu,
                    8,
                    mem,
                    region,
                    Some(kind),
                    price,
                    Some(spot),
                    capacity,
                    0.99,
                ),
            )
        };
        let lambda = |id, gpu, count, mem, region, price, capacity| {
            (
                Lambda,
                offer(
                    id, gpu, count, mem, region, None, price, None, capacity, 0.99,
                ),
            )
        };
        let vast = |id, gpu, count, mem, region, price, capacity, reliability| {
            (
                Vast,
                offer(
                    id,
                    gpu,
                    count,
                    mem,
                    region,
                    None,
                    price,
                    vast_spot(price),
                    capacity,
                    reliability,
                ),
            )
        };
        MarketParams {
            duration_s: 7 * 86_400,
            tick_s: 300,
            daily_swing: 0.06,
            mean_reversion: 0.02,
            min_change: 0.005,
            clouds: vec![
                CloudParams {
                    cloud: Runpod,
                    timing: timing(30, 60, 5),
                    on_demand_walk: 0.0,
                    spot_walk: 0.03,
                    on_demand_band: (1.0, 1.0),
                    spot_band: (0.7, 1.5),
                    mean_available_h: 20.0,
                    mean_sold_out_h: 2.0,
                    reclaims_per_day: 1.5,
                    rate_limit_bursts_per_day: 2.0,
                    refusal_bursts_per_day: 3.0,
                },
                CloudParams {
                    cloud: Lambda,
                    timing: timing(60, 180, 30),
                    on_demand_walk: 0.0,
                    spot_walk: 0.0,
                    on_demand_band: (1.0, 1.0),
                    spot_band: (1.0, 1.0),
                    mean_available_h: 10.0,
                    mean_sold_out_h: 4.0,
                    reclaims_per_day: 0.0,
                    rate_limit_bursts_per_day: 1.0,
                    refusal_bursts_per_day: 4.0,
                },
                CloudParams {
                    cloud: Vast,
                    timing: timing(20, 120, 5),
                    on_demand_walk: 0.02,
                    spot_walk: 0.04,
                    on_demand_band: (0.8, 1.25),
                    spot_band: (0.6, 1.5),
                    mean_available_h: 8.0,
                    mean_sold_out_h: 3.0,
                    reclaims_per_day: 2.5,
                    rate_limit_bursts_per_day: 2.0,
                    refusal_bursts_per_day: 2.0,
                },
            ],
            offers: vec![
                runpod(
                    101,
                    "NVIDIA GeForce RTX 4090",
                    24,
                    "US-KS-2",
                    "SECURE",
                    0.44,
                    0.35,
                    16,
                ),
                runpod(
                    102,
                    "NVIDIA GeForce RTX 4090",
                    24,
                    "US-TX-3",
                    "COMMUNITY",
                    0.31,
                    0.20,
                    8,
                ),
                runpod(
                    103,
                    "NVIDIA A100 80GB PCIe",
                    80,
                    "US-KS-2",
                    "SECURE",
                    1.64,
                    0.82,
                    8,
                ),
                runpod(
                    104,
                    "NVIDIA H100 80GB HBM3",
                    80,
                    "EU-RO-1",
                    "SECURE",
                    2.99,
                    1.75,
                    16,
                ),
                lambda(201, "gpu_1x_a100", 1, 40, "us-east-1", 1.29, 4),
                lambda(202, "gpu_1x_a100_sxm4", 1, 40, "us-west-2", 1.29, 2),
                lambda(203, "gpu_1x_h100_sxm5", 1, 80, "us-east-1", 3.29, 4),
                lambda(204, "gpu_8x_h100_sxm5", 8, 80, "us-west-3", 23.92, 1),
                vast(301, "RTX 4090", 1, 24, "Austin, US", 0.40, 4, 0.995),
                vast(302, "RTX 4090", 1, 24, "Quebec, CA", 0.38, 3, 0.98),
                vast(303, "RTX 4090", 2, 24, "Berlin, DE", 0.79, 2, 0.99),
                vast(304, "A100 SXM4", 1, 80, "Dallas, US", 1.10, 3, 0.995),
                vast(305, "H100 SXM", 1, 80, "Helsinki, FI", 2.20, 3, 0.999),
                vast(306, "H100 SXM", 8, 80, "Ashburn, US", 17.50, 1, 0.999),
            ],
        }
    }

    fn cloud(&self, cloud: Cloud) -> Option<&CloudParams> {
        self.clouds.iter().find(|c| c.cloud == cloud)
    }
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// An exponential draw with this mean.
fn exponential(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    -u.ln() * mean
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One walked price.
struct Walk {
    base: f64,
    log: f64,
    last_written: f64,
}

impl Walk {
    fn new(base: f64) -> Walk {
        Walk {
            base,
            log: 0.0,
            last_written: base,
        }
    }

    fn step(&mut self, rng: &mut ChaCha8Rng, sigma: f64, reversion: f64, band: (f64, f64)) {
        if sigma > 0.0 {
            self.log += -reversion * self.log + sigma * normal(rng);
            self.log = self.log.clamp(band.0.ln(), band.1.ln());
        }
    }

    fn price(&self, cycle: f64, band: (f64, f64)) -> f64 {
        let raw = self.base * self.log.exp() * (1.0 + cycle);
        round3(raw.clamp(self.base * band.0, self.base * band.1))
    }
}

/// Generates a trace.
pub fn generate(params: &MarketParams, seed: u64) -> Trace {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut events = Vec::new();
    let ticks = params.duration_s / params.tick_s.max(1);
    for (cloud, offer) in &params.offers {
        let Some(cp) = params.cloud(*cloud) else {
            continue;
        };
        let id = offer.id.unwrap_or_default();
        let mut on_demand = Walk::new(offer.price_per_hour);
        let mut spot = offer.spot_price_per_hour.map(Walk::new);
        // Capacity: start available; the next switch after an exponential time.
        let mut available = true;
        let mut switch_at = exponential(&mut rng, cp.mean_available_h * HOUR);
        let mut next_reclaim = (cp.reclaims_per_day > 0.0 && spot.is_some())
            .then(|| exponential(&mut rng, DAY / cp.reclaims_per_day));
        for tick in 1..=ticks {
            let at = tick * params.tick_s;
            let t = at as f64;
            let cycle =
                params.daily_swing * (std::f64::consts::TAU * (t / DAY - 10.0 / 24.0)).sin();
            let swung = |walk_sigma: f64| if walk_sigma > 0.0 { cycle } else { 0.0 };
            on_demand.step(
                &mut rng,
                cp.on_demand_walk,
                params.mean_reversion,
                cp.on_demand_band,
            );
            let price = on_demand.price(swung(cp.on_demand_walk), cp.on_demand_band);
            let spot_price = spot.as_mut().map(|walk| {
                walk.step(&mut rng, cp.spot_walk, params.mean_reversion, cp.spot_band);
                walk.price(swung(cp.spot_walk), cp.spot_band).min(price)
            });
            let moved = |now: f64, last: f64| (now - last).abs() > params.min_change * last;
            let spot_moved = match (&spot, spot_price) {
                (Some(walk), Some(p)) => moved(p, walk.last_written),
                _ => false,
            };
            if moved(price, on_demand.last_written) || spot_moved {
                on_demand.last_written = price;
                if let (Some(walk), Some(p)) = (spot.as_mut(), spot_price) {
                    walk.last_written = p;
                }
                events.push(Event {
                    at_s: at,
                    provider: *cloud,
                    change: Change::Price {
                        offer_id: id,
                        price_per_hour: price,
                        spot_price_per_hour: spot_price,
                    },
                });
            }
            while t >= switch_at {
                available = !available;
                let mean = if available {
                    cp.mean_available_h
                } else {
                    cp.mean_sold_out_h
                };
                switch_at += exponential(&mut rng, mean * HOUR).max(params.tick_s as f64);
                let free = if available {
                    rng.random_range(1..=offer.capacity.max(1))
                } else {
                    0
                };
                events.push(Event {
                    at_s: at,
                    provider: *cloud,
                    change: Change::Capacity {
                        offer_id: id,
                        available: free,
                    },
                });
            }
            while let Some(when) = next_reclaim
                && t >= when
            {
                events.push(Event {
                    at_s: at,
                    provider: *cloud,
                    change: Change::Reclaim { offer_id: id },
                });
                next_reclaim = Some(when + exponential(&mut rng, DAY / cp.reclaims_per_day));
            }
        }
    }
    for cp in &params.clouds {
        let mut burst = |rate: f64, make: &mut dyn FnMut(&mut ChaCha8Rng) -> Change| {
            if rate <= 0.0 {
                return;
            }
            let mut t = exponential(&mut rng, DAY / rate);
            while t < params.duration_s as f64 {
                let change = make(&mut rng);
                events.push(Event {
                    at_s: t as u64,
                    provider: cp.cloud,
                    change,
                });
                t += exponential(&mut rng, DAY / rate);
            }
        };
        burst(cp.rate_limit_bursts_per_day, &mut |rng| Change::RateLimit {
            for_s: rng.random_range(10..=60),
            retry_after_s: rng.random_range(5..=30),
        });
        burst(cp.refusal_bursts_per_day, &mut |rng| {
            Change::RefuseCapacity {
                for_s: rng.random_range(300..=1800),
            }
        });
    }
    // Stable: events at the same second keep the order they were made in.
    events.sort_by_key(|e| e.at_s);
    Trace {
        header: Header {
            format: FORMAT.to_owned(),
            duration_s: params.duration_s,
            seed: Some(seed),
            sources: Some(SOURCES.to_owned()),
            parameters: serde_json::to_value(params).ok(),
        },
        timings: params.clouds.iter().map(|c| (c.cloud, c.timing)).collect(),
        offers: params.offers.clone(),
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_trace_and_another_seed_another() {
        let params = MarketParams::week();
        let write = |trace: &Trace| {
            let mut out = Vec::new();
            trace.write(&mut out).unwrap();
            out
        };
        let a = write(&generate(&params, 7));
        assert_eq!(a, write(&generate(&params, 7)));
        assert_ne!(a, write(&generate(&params, 8)));
    }

    #[test]
    fn prices_stay_in_their_bands_and_spot_never_exceeds_on_demand() {
        let params = MarketParams::week();
        let trace = generate(&params, 42);
        assert!(trace.events.len() > 1000, "{} events", trace.events.len());
        for event in &trace.events {
            let Change::Price {
                offer_id,
                price_per_hour,
                spot_price_per_hour,
            } = &event.change
            else {
                continue;
            };
            let (_, offer) = params
                .offers
                .iter()
                .find(|(c, o)| *c == event.provider && o.id == Some(*offer_id))
                .unwrap();
            let band = params.cloud(event.provider).unwrap().on_demand_band;
            let list = offer.price_per_hour;
            assert!(
                *price_per_hour >= round3(list * band.0)
                    && *price_per_hour <= round3(list * band.1),
                "{price_per_hour} outside {band:?} of {list}"
            );
            if let Some(spot) = spot_price_per_hour {
                assert!(spot <= price_per_hour, "spot {spot} above {price_per_hour}");
            }
        }
        assert_eq!(
            trace
                .events
                .iter()
                .filter(|e| e.provider == Cloud::Lambda && matches!(e.change, Change::Price { .. }))
                .count(),
            0,
            "Lambda's list prices do not move"
        );
    }

    #[test]
    fn a_written_trace_reads_back_the_same() {
        let trace = generate(&MarketParams::week(), 3).truncated(86_400);
        let mut out = Vec::new();
        trace.write(&mut out).unwrap();
        let back = Trace::read(out.as_slice()).unwrap();
        assert_eq!(back.events, trace.events);
        assert_eq!(back.offers.len(), trace.offers.len());
        assert_eq!(back.header, trace.header);
    }
}
