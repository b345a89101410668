//! The job mix a replay submits: when each GPU job arrives, how much work it has, which GPU
//! models and how many it accepts, whether it tolerates spot, and what it may pay at most.
//! JSON Lines, one job per line (the format is in `docs/REPLAY.md`), and a seeded generator.
//!
//! Not placement: the strategy decides where a job runs (see [`crate::strategy`]).

use std::collections::BTreeSet;
use std::io::{BufRead, Write};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::lines::{self, LinesError};

/// One GPU job (a Pod, to the node).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Unique, lowercase letters, digits and dashes (it names the instances).
    pub id: String,
    /// Seconds from the start of the trace at which the Pod is created.
    pub arrival_s: u64,
    /// Seconds of GPU work; a preemption loses the work done so far.
    pub work_s: u64,
    /// GPUs per instance.
    pub gpus: u32,
    /// Acceptable GPU models, as a Pod writes them (`cloud.aibrix.ai/gpu-models`).
    pub models: Vec<String>,
    /// Whether the job may run on interruptible (spot) capacity.
    pub spot_ok: bool,
    /// The most the job pays per hour for its whole instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_price_per_hour: Option<f64>,
}

/// A job file that cannot be used, with the line and field at fault.
pub type JobsError = LinesError;

impl Job {
    fn check(&self) -> Result<(), String> {
        let id_ok = !self.id.is_empty()
            && self.id.len() <= 40
            && self
                .id
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !id_ok {
            return Err(format!(
                "id is {:?} (1 to 40 lowercase letters, digits and dashes)",
                self.id
            ));
        }
        if self.work_s == 0 {
            return Err(format!("work_s is 0 for job {}", self.id));
        }
        if self.gpus == 0 {
            return Err(format!("gpus is 0 for job {}", self.id));
        }
        if self.models.iter().any(|m| m.trim().is_empty()) {
            return Err(format!("models has an empty name for job {}", self.id));
        }
        if let Some(max) = self.max_price_per_hour
            && !(max.is_finite() && max > 0.0)
        {
            return Err(format!(
                "max_price_per_hour is {max} for job {} (must be above 0)",
                self.id
            ));
        }
        Ok(())
    }
}

/// Reads and validates a job file (ids unique, arrivals in any order).
pub fn read(input: impl BufRead) -> Result<Vec<Job>, JobsError> {
    let mut jobs = Vec::new();
    let mut ids = BTreeSet::new();
    for parsed in lines::read::<Job>(input, "jobs") {
        let (line, job) = parsed?;
        let invalid = |message: String| LinesError::invalid("jobs", line, message);
        job.check().map_err(invalid)?;
        if !ids.insert(job.id.clone()) {
            return Err(invalid(format!("id {} twice", job.id)));
        }
        jobs.push(job);
    }
    Ok(jobs)
}

/// Writes jobs as JSON Lines.
pub fn write(jobs: &[Job], mut out: impl Write) -> std::io::Result<()> {
    jobs.iter().try_for_each(|job| lines::write(&mut out, job))
}

/// One kind of job in the mix.
#[derive(Debug, Clone, Serialize)]
pub struct JobClass {
    /// Share of jobs (weights, summed over the classes).
    pub weight: u32,
    /// Models accepted.
    pub models: &'static [&'static str],
    /// GPUs per instance.
    pub gpus: u32,
    /// The most such a job pays per GPU-hour when it sets a maximum.
    pub max_per_gpu_hour: f64,
}

/// The generator's parameters.
#[derive(Debug, Clone, Serialize)]
pub struct JobParams {
    /// How many jobs.
    pub count: usize,
    /// Jobs arrive uniformly over this many seconds from the start.
    pub arrivals_over_s: u64,
    /// Median seconds of work (log-normal).
    pub median_work_s: f64,
    /// Standard deviation of the log of the work.
    pub work_sigma: f64,
    /// Shortest and longest work.
    pub work_range_s: (u64, u64),
    /// Share of jobs that tolerate spot.
    pub spot_share: f64,
    /// Share of jobs with a maximum price.
    pub max_price_share: f64,
    /// The classes.
    pub classes: Vec<JobClass>,
}

impl JobParams {
    /// The mix `make replay` uses: 1,000 jobs over the first six days of a week.
    pub fn week() -> JobParams {
        JobParams {
            count: 1000,
            arrivals_over_s: 6 * 86_400,
            median_work_s: 2.0 * 3600.0,
            work_sigma: 0.9,
            work_range_s: (600, 24 * 3600),
            spot_share: 0.6,
            max_price_share: 0.3,
            classes: vec![
                JobClass {
                    weight: 40,
                    models: &["RTX 4090"],
                    gpus: 1,
                    max_per_gpu_hour: 0.50,
                },
                JobClass {
                    weight: 5,
                    models: &["RTX 4090"],
                    gpus: 2,
                    max_per_gpu_hour: 0.50,
                },
                JobClass {
                    weight: 25,
                    models: &["A100"],
                    gpus: 1,
                    max_per_gpu_hour: 1.70,
                },
                JobClass {
                    weight: 15,
                    models: &["A100", "H100"],
                    gpus: 1,
                    max_per_gpu_hour: 2.50,
                },
                JobClass {
                    weight: 12,
                    models: &["H100"],
                    gpus: 1,
                    max_per_gpu_hour: 3.00,
                },
                JobClass {
                    weight: 3,
                    models: &["H100"],
                    gpus: 8,
                    max_per_gpu_hour: 3.00,
                },
            ],
        }
    }
}

/// Generates jobs, sorted by arrival, named `job-0001`...
pub fn generate(params: &JobParams, seed: u64) -> Vec<Job> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6a6f_6273);
    let total: u32 = params.classes.iter().map(|c| c.weight).sum();
    let mut jobs: Vec<Job> = (0..params.count)
        .map(|_| {
            let mut pick = rng.random_range(0..total.max(1));
            let class = params
                .classes
                .iter()
                .find(|c| {
                    if pick < c.weight {
                        true
                    } else {
                        pick -= c.weight;
                        false
                    }
                })
                .unwrap_or(&params.classes[0]);
            let u1: f64 = rng.random_range(f64::EPSILON..1.0);
            let u2: f64 = rng.random();
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            let work = (params.median_work_s * (params.work_sigma * z).exp()) as u64;
            let work = work.clamp(params.work_range_s.0, params.work_range_s.1);
            let spot_ok = rng.random_bool(params.spot_share);
            let capped = rng.random_bool(params.max_price_share);
            Job {
                id: String::new(),
                arrival_s: rng.random_range(0..params.arrivals_over_s.max(1)),
                work_s: work,
                gpus: class.gpus,
                models: class.models.iter().map(|m| (*m).to_owned()).collect(),
                spot_ok,
                max_price_per_hour: capped.then(|| {
                    (class.max_per_gpu_hour * f64::from(class.gpus) * 100.0).round() / 100.0
                }),
            }
        })
        .collect();
    jobs.sort_by_key(|j| j.arrival_s);
    for (n, job) in jobs.iter_mut().enumerate() {
        job.id = format!("job-{:04}", n + 1);
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_jobs_are_valid_and_read_back() {
        let jobs = generate(&JobParams::week(), 1);
        assert_eq!(jobs.len(), 1000);
        let mut out = Vec::new();
        write(&jobs, &mut out).unwrap();
        assert_eq!(read(out.as_slice()).unwrap(), jobs);
        let spot = jobs.iter().filter(|j| j.spot_ok).count();
        assert!((500..700).contains(&spot), "{spot} spot-tolerant jobs");
    }

    #[test]
    fn a_bad_job_is_refused_naming_the_line_and_the_field() {
        let text = "{\"id\":\"a\",\"arrival_s\":0,\"work_s\":60,\"gpus\":1,\"models\":[],\"spot_ok\":true}\n\
                    {\"id\":\"b\",\"arrival_s\":0,\"work_s\":60,\"gpus\":1,\"models\":[],\"spot_ok\":true,\"max_price_per_hour\":-2}\n";
        let error = read(text.as_bytes()).unwrap_err().to_string();
        assert_eq!(
            error,
            "jobs line 2: max_price_per_hour is -2 for job b (must be above 0)"
        );
        let twice = "{\"id\":\"a\",\"arrival_s\":0,\"work_s\":60,\"gpus\":1,\"models\":[],\"spot_ok\":true}\n".repeat(2);
        assert_eq!(
            read(twice.as_bytes()).unwrap_err().to_string(),
            "jobs line 2: id a twice"
        );
        let zero = "{\"id\":\"Job_1\",\"arrival_s\":0,\"work_s\":60,\"gpus\":1,\"models\":[],\"spot_ok\":true}";
        assert!(
            read(zero.as_bytes())
                .unwrap_err()
                .to_string()
                .contains("id is \"Job_1\"")
        );
    }
}
