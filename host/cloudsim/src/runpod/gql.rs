//! RunPod GraphQL (`POST /graphql`): `podFindAndDeployOnDemand`, `podRentInterruptable` (spot,
//! `bidPerGpu` required), `podTerminate`, `podStop`, `podResume`, `podBidResume`, and the queries
//! `myself { pods }`, `pod(input:{podId})` and `gpuTypes`. Resolver errors come back with HTTP 200
//! and an `errors` array; documents that do not parse or validate get HTTP 400.
//!
//! Not the whole RunPod schema: other root fields are validation errors.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::Extensions;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::graphql::{self, Selection};
use super::render;
use super::state::{ActionError, CreateError, NewPod, Placement, RunpodState};
use super::wire::{self, NO_CAPACITY};
use crate::faults::FaultKind;
use crate::schema::{self, Field, Ty, Violation, opt, req};
use crate::server::handler_fault;

const ENV: &[Field] = &[req("key", Ty::Str), req("value", Ty::Str)];

macro_rules! deploy_fields {
    ($($extra:expr),*) => {
        &[
            opt("name", Ty::Str), opt("imageName", Ty::Str), req("gpuTypeId", Ty::Str),
            opt("cloudType", Ty::Str), opt("gpuCount", Ty::Int), opt("volumeInGb", Ty::Int),
            opt("containerDiskInGb", Ty::Int), opt("minVcpuCount", Ty::Int),
            opt("minMemoryInGb", Ty::Int), opt("dockerArgs", Ty::Str), opt("ports", Ty::Str),
            opt("volumeMountPath", Ty::Str), opt("env", Ty::ObjList(ENV)), opt("templateId", Ty::Str),
            opt("networkVolumeId", Ty::Str), opt("dataCenterId", Ty::Str), opt("countryCode", Ty::Str),
            opt("supportPublicIp", Ty::Bool), opt("startSsh", Ty::Bool), opt("startJupyter", Ty::Bool),
            opt("allowedCudaVersions", Ty::StrList), opt("minCudaVersion", Ty::Str),
            opt("minDownload", Ty::Int), opt("minUpload", Ty::Int),
            opt("containerRegistryAuthId", Ty::Str), opt("stopAfter", Ty::Str),
            opt("terminateAfter", Ty::Str), opt("compliance", Ty::StrList) $(, $extra)*
        ]
    };
}

const ON_DEMAND: &[Field] = deploy_fields!();
const INTERRUPTABLE: &[Field] =
    deploy_fields!(req("bidPerGpu", Ty::Num), opt("volumeKey", Ty::Str));
const POD_ID: &[Field] = &[req("podId", Ty::Str)];
const RESUME: &[Field] = &[req("podId", Ty::Str), opt("gpuCount", Ty::Int)];
const BID_RESUME: &[Field] = &[
    req("podId", Ty::Str),
    req("bidPerGpu", Ty::Num),
    opt("gpuCount", Ty::Int),
];
const GPU_TYPES: &[Field] = &[opt("id", Ty::Str), opt("cluster", Ty::Bool)];

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Request {
    query: String,
    #[serde(default)]
    variables: Option<Map<String, Value>>,
    #[serde(default)]
    #[allow(dead_code)]
    operation_name: Option<String>,
}

/// A resolver's failure.
#[derive(Debug)]
enum Failure {
    /// The document is invalid (HTTP 400).
    Invalid(String),
    /// The operation failed (HTTP 200, `errors`).
    Failed(String),
}

type Resolved = Result<Value, Failure>;

/// `POST /graphql`.
pub(crate) async fn graphql(
    State(sim): State<Arc<RunpodState>>,
    ext: Extensions,
    body: Bytes,
) -> Response {
    let operation = match read_operation(&body) {
        Ok(operation) => operation,
        Err(response) => return response,
    };
    let fault = handler_fault(&ext);
    let mut data = Map::new();
    for field in &operation.fields {
        let resolved = match operation.mutation {
            true => mutate(&sim, field, fault.as_ref()),
            false => query(&sim, field),
        };
        match resolved {
            Ok(value) => data.insert(field.key().to_string(), value),
            Err(Failure::Invalid(message)) => {
                return wire::gql_invalid(&message, "GRAPHQL_VALIDATION_FAILED");
            }
            Err(Failure::Failed(message)) => return wire::gql_error(field.key(), &message),
        };
    }
    wire::gql_data(&Value::Object(data))
}

fn read_operation(body: &Bytes) -> Result<graphql::Operation, Response> {
    let request: Request = serde_json::from_slice(body).map_err(|e| {
        let message = format!("POST body is not a GraphQL request: {e}");
        wire::gql_invalid(&message, "BAD_USER_INPUT")
    })?;
    let variables = request.variables.unwrap_or_default();
    graphql::parse(&request.query, &variables)
        .map_err(|message| wire::gql_invalid(&message, "GRAPHQL_PARSE_FAILED"))
}

fn input(field: &Selection, shape: &'static [Field], type_name: &str) -> Result<Value, Failure> {
    let value = field
        .args
        .get("input")
        .cloned()
        .unwrap_or_else(|| json!({}));
    match schema::check(&value, shape).first() {
        None => Ok(value),
        Some(Violation::Unknown { name, .. }) => Err(Failure::Invalid(format!(
            "Field \"{name}\" is not defined by type \"{type_name}\"."
        ))),
        Some(Violation::Missing { name, .. }) => Err(Failure::Invalid(format!(
            "Field \"{type_name}.{name}\" of required type was not provided."
        ))),
        Some(v @ Violation::WrongType { want, .. }) => Err(Failure::Invalid(format!(
            "Field \"{}\" expected a value of type {want}.",
            v.field()
        ))),
    }
}

fn project(value: &Value, field: &Selection, type_name: &str) -> Resolved {
    graphql::project(value, &field.fields, type_name).map_err(Failure::Invalid)
}

fn query(sim: &RunpodState, field: &Selection) -> Resolved {
    let now = sim.core.clock.now();
    match field.name.as_str() {
        "myself" => myself(sim, field),
        "pod" => {
            let id = pod_id(&input(field, POD_ID, "PodFilter")?);
            match sim.get(&id) {
                Some(pod) => project(&render::pod_gql(&pod, &sim.core, now), field, "Pod"),
                None => Ok(Value::Null),
            }
        }
        "gpuTypes" => gpu_types(sim, field),
        other => {
            let message = format!("Cannot query field \"{other}\" on type \"Query\".");
            Err(Failure::Invalid(message))
        }
    }
}

fn myself(sim: &RunpodState, field: &Selection) -> Resolved {
    let now = sim.core.clock.now();
    let pods: Vec<Value> = sim
        .list()
        .iter()
        .map(|p| render::pod_gql(p, &sim.core, now))
        .collect();
    let keys = sim.ssh_keys.lock().join("\n");
    let me = json!({
        "id": "user_sim", "email": "sim@example.com", "pods": pods, "pubKey": keys,
        "clientBalance": 100.0,
    });
    project(&me, field, "User")
}

fn gpu_types(sim: &RunpodState, field: &Selection) -> Resolved {
    let filter = input(field, GPU_TYPES, "GpuTypeFilter")?;
    let wanted = filter["id"].as_str();
    let market = sim.core.market.lock();
    let types: Vec<Value> = render::by_gpu(market.offers())
        .into_iter()
        .filter(|(id, _)| wanted.is_none_or(|w| w == id))
        .map(|(id, offers)| render::gql_gpu_type(&id, &offers))
        .collect();
    project(&Value::Array(types), field, "GpuType")
}

fn mutate(sim: &RunpodState, field: &Selection, fault: Option<&FaultKind>) -> Resolved {
    let name = field.name.as_str();
    let Some((shape, type_name)) = mutation_input(name) else {
        let message = format!("Cannot query field \"{name}\" on type \"Mutation\".");
        return Err(Failure::Invalid(message));
    };
    let args = input(field, shape, type_name)?;
    let id = pod_id(&args);
    match name {
        "podFindAndDeployOnDemand" | "podRentInterruptable" => deploy(sim, field, &args, fault),
        "podTerminate" if sim.terminate(&id) => Ok(Value::Null),
        "podTerminate" => Err(Failure::Failed("pod not found to terminate".into())),
        "podStop" => acted(sim, field, sim.stop(&id)),
        "podResume" => acted(sim, field, sim.start(&id, None)),
        _ => acted(sim, field, sim.start(&id, args["bidPerGpu"].as_f64())),
    }
}

/// The input shape and type name of each supported mutation.
fn mutation_input(name: &str) -> Option<(&'static [Field], &'static str)> {
    Some(match name {
        "podFindAndDeployOnDemand" => (ON_DEMAND, "PodFindAndDeployOnDemandInput"),
        "podRentInterruptable" => (INTERRUPTABLE, "PodRentInterruptableInput"),
        "podTerminate" => (POD_ID, "PodTerminateInput"),
        "podStop" => (POD_ID, "PodStopInput"),
        "podResume" => (RESUME, "PodResumeInput"),
        "podBidResume" => (BID_RESUME, "PodBidResumeInput"),
        _ => return None,
    })
}

fn pod_id(args: &Value) -> String {
    args["podId"].as_str().unwrap_or_default().to_string()
}

fn acted(
    sim: &RunpodState,
    field: &Selection,
    result: Result<super::state::Pod, ActionError>,
) -> Resolved {
    match result {
        Ok(pod) => project(
            &render::pod_gql(&pod, &sim.core, sim.core.clock.now()),
            field,
            "Pod",
        ),
        Err(ActionError::NotFound) => Err(Failure::Failed("pod not found".into())),
        Err(ActionError::Conflict) => Err(Failure::Failed(
            "There are not enough free GPUs on the host machine to start this pod.".into(),
        )),
    }
}

fn deploy(
    sim: &RunpodState,
    field: &Selection,
    args: &Value,
    fault: Option<&FaultKind>,
) -> Resolved {
    let spec = new_pod(args)?;
    if matches!(
        fault,
        Some(FaultKind::CapacityExhausted | FaultKind::OfferVanishes)
    ) {
        return Err(Failure::Failed(NO_CAPACITY.into()));
    }
    let low = matches!(fault, Some(FaultKind::BidTooLow));
    let bid = spec.bid_per_gpu.unwrap_or_default();
    match sim.create(spec, low) {
        Ok(pod) => project(
            &render::pod_gql(&pod, &sim.core, sim.core.clock.now()),
            field,
            "Pod",
        ),
        Err(CreateError::NoCapacity) => Err(Failure::Failed(NO_CAPACITY.into())),
        Err(CreateError::UnknownGpu) => Err(Failure::Failed(format!(
            "gpuTypeId {} is not a valid GPU type",
            args["gpuTypeId"]
        ))),
        Err(CreateError::BidTooLow { min_bid }) => Err(Failure::Failed(format!(
            "Your bid of ${bid:.3}/gpu/hr is below the minimum bid of ${min_bid:.3}/gpu/hr for this GPU type."
        ))),
        Err(CreateError::Quota) => Err(Failure::Failed(
            "Insufficient balance to deploy this pod.".into(),
        )),
    }
}

fn new_pod(args: &Value) -> Result<NewPod, Failure> {
    let text = |key: &str| args[key].as_str().map(str::to_string);
    let env = args["env"].as_array().into_iter().flatten();
    let env = env.filter_map(|e| {
        Some((
            e["key"].as_str()?.to_string(),
            e["value"].as_str()?.to_string(),
        ))
    });
    let ports = text("ports").unwrap_or_default();
    let ports = ports
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string);
    Ok(NewPod {
        name: text("name").unwrap_or_default(),
        image: text("imageName").unwrap_or_default(),
        placement: placement(args)?,
        disk_gb: args["containerDiskInGb"].as_i64().unwrap_or(50),
        volume_gb: args["volumeInGb"].as_i64().unwrap_or(0),
        env: env.collect(),
        ports: ports.collect(),
        args: text("dockerArgs"),
        bid_per_gpu: args["bidPerGpu"].as_f64(),
        registry: text("containerRegistryAuthId"),
    })
}

/// GPU type, count, cloud (`ALL` is any), one data center, or a country.
fn placement(args: &Value) -> Result<Placement, Failure> {
    let text = |key: &str| args[key].as_str().map(str::to_string);
    let cloud = match text("cloudType").as_deref() {
        None | Some("ALL") => None,
        Some(c @ ("SECURE" | "COMMUNITY")) => Some(c.to_string()),
        Some(other) => {
            let message = format!("Value \"{other}\" does not exist in \"CloudTypeEnum\" enum.");
            return Err(Failure::Invalid(message));
        }
    };
    Ok(Placement {
        gpu_id: text("gpuTypeId").unwrap_or_default(),
        count: args["gpuCount"].as_u64().unwrap_or(1).max(1) as u32,
        cloud,
        data_centers: text("dataCenterId").into_iter().collect(),
        country: text("countryCode"),
    })
}
