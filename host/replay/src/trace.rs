//! The market trace file: what three GPU clouds offered over a stretch of time, as JSON Lines
//! that anyone can write (see `docs/REPLAY.md` for the format with an example of every record).
//!
//! A trace is a header, then each provider's boot timing, then its offers at time zero in the
//! simulator's own spelling (the shape of `neocloud-cloudsim`'s market configuration, ids
//! required), then events in time order: a price or capacity change, a spot reclaim (every
//! interruptible instance on the offer stops, as when a higher bid arrives), a burst of rate
//! limiting or of capacity refusals on creates.
//!
//! Not the generator (see [`crate::generate`]) and not the replay (see [`crate::harness`]).

use std::collections::BTreeSet;
use std::fmt;
use std::io::{BufRead, Write};

use neocloud_cloudsim::{OfferConfig, Timing};
use serde::{Deserialize, Serialize};

use crate::lines::{self, LinesError};

/// The format this code reads and writes.
pub const FORMAT: &str = "neocloud-market-trace/v1";

/// A simulator of the trace: the provider's name as the simulators and the node spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Cloud {
    /// RunPod.
    Runpod,
    /// Lambda Cloud.
    Lambda,
    /// Vast.ai.
    Vast,
}

impl Cloud {
    /// Every cloud, in the order reports list them.
    pub const ALL: [Cloud; 3] = [Cloud::Runpod, Cloud::Lambda, Cloud::Vast];

    /// The name as written in traces and reports.
    pub fn name(self) -> &'static str {
        match self {
            Cloud::Runpod => "runpod",
            Cloud::Lambda => "lambda",
            Cloud::Vast => "vast",
        }
    }
}

impl fmt::Display for Cloud {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The first line of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// Always [`FORMAT`].
    pub format: String,
    /// Seconds of market time the trace covers.
    pub duration_s: u64,
    /// The generator's seed, if a generator wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Where the prices come from, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<String>,
    /// The generator's parameters, as it ran (free-form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
}

/// One line of a trace.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Record {
    /// The header (first line only).
    Header(Header),
    /// How long a provider's instances take to boot and stop.
    Timing {
        /// The provider.
        provider: Cloud,
        /// Its timing.
        timing: Timing,
    },
    /// An offer present at time zero.
    Offer {
        /// The provider.
        provider: Cloud,
        /// The offer's id, which events name.
        offer_id: u64,
        /// The offer, in the shape of the simulator's market configuration.
        offer: OfferConfig,
    },
    /// New prices for an offer; instances already rented keep theirs.
    Price {
        /// Seconds from the start of the trace.
        at_s: u64,
        /// The provider.
        provider: Cloud,
        /// The offer.
        offer_id: u64,
        /// On-demand price per hour, in the simulator's unit for the offer.
        price_per_hour: f64,
        /// Minimum spot bid per hour; absent: not rentable as spot.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        spot_price_per_hour: Option<f64>,
    },
    /// What the offer has free now, whoever holds the rest.
    Capacity {
        /// Seconds from the start of the trace.
        at_s: u64,
        /// The provider.
        provider: Cloud,
        /// The offer.
        offer_id: u64,
        /// Units free (RunPod: GPUs; Lambda and Vast: instances).
        available: u32,
    },
    /// Every interruptible instance running on the offer is reclaimed.
    Reclaim {
        /// Seconds from the start of the trace.
        at_s: u64,
        /// The provider.
        provider: Cloud,
        /// The offer.
        offer_id: u64,
    },
    /// For `for_s` seconds every request is answered 429 with `Retry-After`.
    RateLimit {
        /// Seconds from the start of the trace.
        at_s: u64,
        /// The provider.
        provider: Cloud,
        /// How long it lasts.
        for_s: u64,
        /// The `Retry-After` in seconds.
        retry_after_s: u64,
    },
    /// For `for_s` seconds every create is refused for capacity although the market lists
    /// some (the provider's view is staler than its catalog).
    RefuseCapacity {
        /// Seconds from the start of the trace.
        at_s: u64,
        /// The provider.
        provider: Cloud,
        /// How long it lasts.
        for_s: u64,
    },
}

/// Something that happens to the market at a point in time.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds from the start of the trace.
    pub at_s: u64,
    /// The provider.
    pub provider: Cloud,
    /// What happens.
    pub change: Change,
}

/// What an [`Event`] changes (the fields are those of the [`Record`] of the same name).
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// New prices for an offer.
    Price {
        /// The offer.
        offer_id: u64,
        /// On-demand price per hour.
        price_per_hour: f64,
        /// Minimum spot bid per hour.
        spot_price_per_hour: Option<f64>,
    },
    /// What the offer has free now.
    Capacity {
        /// The offer.
        offer_id: u64,
        /// Units free.
        available: u32,
    },
    /// Every interruptible instance on the offer is reclaimed.
    Reclaim {
        /// The offer.
        offer_id: u64,
    },
    /// Requests are rate limited for a while.
    RateLimit {
        /// How long it lasts.
        for_s: u64,
        /// The `Retry-After` in seconds.
        retry_after_s: u64,
    },
    /// Creates are refused for capacity for a while.
    RefuseCapacity {
        /// How long it lasts.
        for_s: u64,
    },
}

impl Event {
    fn from_record(record: &Record) -> Option<Event> {
        let (at_s, provider, change) = match *record {
            Record::Price {
                at_s,
                provider,
                offer_id,
                price_per_hour,
                spot_price_per_hour,
            } => (
                at_s,
                provider,
                Change::Price {
                    offer_id,
                    price_per_hour,
                    spot_price_per_hour,
                },
            ),
            Record::Capacity {
                at_s,
                provider,
                offer_id,
                available,
            } => (
                at_s,
                provider,
                Change::Capacity {
                    offer_id,
                    available,
                },
            ),
            Record::Reclaim {
                at_s,
                provider,
                offer_id,
            } => (at_s, provider, Change::Reclaim { offer_id }),
            Record::RateLimit {
                at_s,
                provider,
                for_s,
                retry_after_s,
            } => (
                at_s,
                provider,
                Change::RateLimit {
                    for_s,
                    retry_after_s,
                },
            ),
            Record::RefuseCapacity {
                at_s,
                provider,
                for_s,
            } => (at_s, provider, Change::RefuseCapacity { for_s }),
            Record::Header(_) | Record::Timing { .. } | Record::Offer { .. } => return None,
        };
        Some(Event {
            at_s,
            provider,
            change,
        })
    }

    fn to_record(&self) -> Record {
        let (at_s, provider) = (self.at_s, self.provider);
        match self.change.clone() {
            Change::Price {
                offer_id,
                price_per_hour,
                spot_price_per_hour,
            } => Record::Price {
                at_s,
                provider,
                offer_id,
                price_per_hour,
                spot_price_per_hour,
            },
            Change::Capacity {
                offer_id,
                available,
            } => Record::Capacity {
                at_s,
                provider,
                offer_id,
                available,
            },
            Change::Reclaim { offer_id } => Record::Reclaim {
                at_s,
                provider,
                offer_id,
            },
            Change::RateLimit {
                for_s,
                retry_after_s,
            } => Record::RateLimit {
                at_s,
                provider,
                for_s,
                retry_after_s,
            },
            Change::RefuseCapacity { for_s } => Record::RefuseCapacity {
                at_s,
                provider,
                for_s,
            },
        }
    }
}

/// A whole trace.
#[derive(Debug, Clone)]
pub struct Trace {
    /// The header.
    pub header: Header,
    /// Each provider's timing (providers without one boot as the simulator's default).
    pub timings: Vec<(Cloud, Timing)>,
    /// Offers at time zero.
    pub offers: Vec<(Cloud, OfferConfig)>,
    /// Events in time order.
    pub events: Vec<Event>,
}

/// A trace that cannot be used, with the line and field at fault.
pub type TraceError = LinesError;

fn invalid(line: usize, message: impl Into<String>) -> TraceError {
    LinesError::invalid("trace", line, message)
}

fn price_ok(value: f64) -> bool {
    value.is_finite() && value > 0.0
}

impl Trace {
    /// Reads and validates a trace.
    pub fn read(input: impl BufRead) -> Result<Trace, TraceError> {
        let mut header = None;
        let mut timings = Vec::new();
        let mut offers: Vec<(Cloud, OfferConfig)> = Vec::new();
        let mut events: Vec<Event> = Vec::new();
        let mut ids = BTreeSet::new();
        for parsed in lines::read::<Record>(input, "trace") {
            let (line, record) = parsed?;
            let Some(head) = &header else {
                let Record::Header(h) = record else {
                    return Err(invalid(line, "the first record must be the header"));
                };
                if h.format != FORMAT {
                    return Err(invalid(
                        line,
                        format!("format is {:?}; this replay reads {FORMAT:?}", h.format),
                    ));
                }
                if h.duration_s == 0 {
                    return Err(invalid(line, "duration_s is 0; a trace covers some time"));
                }
                header = Some(h);
                continue;
            };
            match record {
                Record::Header(_) => return Err(invalid(line, "a second header")),
                Record::Timing { provider, timing } => {
                    if !events.is_empty() {
                        return Err(invalid(line, "timing after the first event"));
                    }
                    timings.push((provider, timing));
                }
                Record::Offer {
                    provider,
                    offer_id: id,
                    mut offer,
                } => {
                    if !events.is_empty() {
                        return Err(invalid(line, "offer after the first event"));
                    }
                    if !ids.insert((provider, id)) {
                        return Err(invalid(line, format!("offer_id {id} of {provider} twice")));
                    }
                    offer.id = Some(id);
                    if !price_ok(offer.price_per_hour) {
                        return Err(invalid(
                            line,
                            format!(
                                "offer.price_per_hour is {} (must be above 0)",
                                offer.price_per_hour
                            ),
                        ));
                    }
                    offers.push((provider, offer));
                }
                record => {
                    let event =
                        Event::from_record(&record).ok_or_else(|| invalid(line, "not an event"))?;
                    if event.at_s > head.duration_s {
                        return Err(invalid(
                            line,
                            format!(
                                "at_s is {} (after the trace's duration_s {})",
                                event.at_s, head.duration_s
                            ),
                        ));
                    }
                    if let Some(last) = events.last()
                        && event.at_s < last.at_s
                    {
                        return Err(invalid(
                            line,
                            format!(
                                "at_s is {} (before the previous event's {})",
                                event.at_s, last.at_s
                            ),
                        ));
                    }
                    check_change(line, &event, &ids)?;
                    events.push(event);
                }
            }
        }
        let header = header.ok_or_else(|| invalid(1, "the trace is empty (no header)"))?;
        Ok(Trace {
            header,
            timings,
            offers,
            events,
        })
    }

    /// Writes the trace as JSON Lines.
    pub fn write(&self, mut out: impl Write) -> std::io::Result<()> {
        let mut line = |record: &Record| lines::write(&mut out, record);
        line(&Record::Header(self.header.clone()))?;
        for (provider, timing) in &self.timings {
            line(&Record::Timing {
                provider: *provider,
                timing: *timing,
            })?;
        }
        for (provider, offer) in &self.offers {
            line(&Record::Offer {
                provider: *provider,
                offer_id: offer.id.unwrap_or_default(),
                offer: offer.clone(),
            })?;
        }
        for event in &self.events {
            line(&event.to_record())?;
        }
        Ok(())
    }

    /// The offers of one provider at time zero.
    pub fn offers_of(&self, cloud: Cloud) -> Vec<OfferConfig> {
        self.offers
            .iter()
            .filter(|(c, _)| *c == cloud)
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// The timing of one provider, if the trace sets it.
    pub fn timing_of(&self, cloud: Cloud) -> Option<Timing> {
        self.timings
            .iter()
            .find(|(c, _)| *c == cloud)
            .map(|(_, t)| *t)
    }

    /// A trace cut to its first `seconds` (for a short replay of the same market).
    pub fn truncated(&self, seconds: u64) -> Trace {
        let mut cut = self.clone();
        cut.header.duration_s = seconds.min(self.header.duration_s);
        cut.events.retain(|e| e.at_s <= cut.header.duration_s);
        cut
    }
}

fn check_change(
    line: usize,
    event: &Event,
    ids: &BTreeSet<(Cloud, u64)>,
) -> Result<(), TraceError> {
    let provider = event.provider;
    let known = |id: u64| {
        if ids.contains(&(provider, id)) {
            Ok(())
        } else {
            Err(invalid(
                line,
                format!("offer_id {id} is not an offer of {provider}"),
            ))
        }
    };
    match &event.change {
        Change::Price {
            offer_id,
            price_per_hour,
            spot_price_per_hour,
        } => {
            known(*offer_id)?;
            if !price_ok(*price_per_hour) {
                return Err(invalid(
                    line,
                    format!("price_per_hour is {price_per_hour} (must be above 0)"),
                ));
            }
            if let Some(spot) = spot_price_per_hour
                && !price_ok(*spot)
            {
                return Err(invalid(
                    line,
                    format!("spot_price_per_hour is {spot} (must be above 0)"),
                ));
            }
        }
        Change::Capacity { offer_id, .. } | Change::Reclaim { offer_id } => known(*offer_id)?,
        Change::RateLimit { for_s, .. } | Change::RefuseCapacity { for_s } => {
            if *for_s == 0 {
                return Err(invalid(line, "for_s is 0 (must be at least 1)"));
            }
        }
    }
    Ok(())
}
