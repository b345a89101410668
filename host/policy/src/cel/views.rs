//! The input views as `cel` values for the interpreter: records that answer field selections
//! by borrowing from the caller's views, so an interpreted evaluation allocates a few small
//! boxes per field read instead of building maps of strings for every offer.
//!
//! Not for the typed fast path, which reads the views directly.

use std::collections::HashMap;

use cel::ExecutionError;
use cel::common::traits::Indexer;
use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelString, MAP_TYPE, Type,
};
use cel::common::value::{CowVal, Val};

use super::schema::{CelAttempt, CelGpu, CelOffer, CelWorkload};

/// Implements `Val` and `Indexer` for a record view; `$get` maps a field name to a value.
macro_rules! record_val {
    ($ty:ident, $get:ident) => {
        impl Val for $ty<'_> {
            fn get_type(&self) -> &Type {
                &MAP_TYPE
            }

            fn cel_type() -> &'static Type {
                &MAP_TYPE
            }

            fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
            where
                Self: 'w,
            {
                Some(self)
            }

            fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
            where
                Self: 'w,
            {
                Box::new(self.clone())
            }
        }

        impl Indexer for $ty<'_> {
            fn get<'b, 'w>(&'b self, key: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
            where
                Self: 'w,
            {
                $get(self, field_name(key)?)
            }

            fn steal<'w>(
                self: Box<Self>,
                key: &dyn Val,
            ) -> Result<Box<dyn Val + 'w>, ExecutionError>
            where
                Self: 'w,
            {
                self.get(key).map(CowVal::into_owned)
            }
        }
    };
}

fn field_name(key: &dyn Val) -> Result<&str, ExecutionError> {
    match key.downcast_ref::<CelString<'_>>() {
        Some(s) => Ok(s.inner()),
        None => Err(ExecutionError::UnexpectedType {
            got: key.get_type().name().to_owned(),
            want: "string".to_owned(),
        }),
    }
}

fn owned<'b, 'w>(v: impl Val + 'w) -> Result<CowVal<'b, 'w>, ExecutionError> {
    Ok(CowVal::Owned(Box::new(v)))
}

fn text<'b, 'w>(s: &'w str) -> Result<CowVal<'b, 'w>, ExecutionError> {
    owned(CelString::from(s))
}

/// `offer`.
#[derive(Clone, Debug)]
pub(crate) struct OfferVal<'a>(pub &'a CelOffer);

fn offer_field<'b, 'w>(v: &'b OfferVal<'w>, f: &str) -> Result<CowVal<'b, 'w>, ExecutionError> {
    let o: &'w CelOffer = v.0;
    match f {
        "provider" => text(&o.provider),
        "id" => text(&o.id),
        "gpu" => owned(GpuVal(&o.gpu)),
        "gpu_count" => owned(CelInt::from(o.gpu_count)),
        "price_per_hour" => owned(CelDouble::from(o.price_per_hour)),
        "spot" => owned(CelBool::from(o.spot)),
        "region" => text(&o.region),
        "reliability" => owned(CelDouble::from(o.reliability)),
        "verified" => owned(CelBool::from(o.verified)),
        "disk_gib" => owned(CelInt::from(o.disk_gib)),
        _ => Err(ExecutionError::no_such_key(f)),
    }
}
record_val!(OfferVal, offer_field);

/// `offer.gpu`.
#[derive(Clone, Debug)]
struct GpuVal<'a>(&'a CelGpu);

fn gpu_field<'b, 'w>(v: &'b GpuVal<'w>, f: &str) -> Result<CowVal<'b, 'w>, ExecutionError> {
    let g: &'w CelGpu = v.0;
    match f {
        "model" => text(&g.model),
        "memory_gib" => owned(CelInt::from(g.memory_gib)),
        _ => Err(ExecutionError::no_such_key(f)),
    }
}
record_val!(GpuVal, gpu_field);

/// An element of `attempts`.
#[derive(Clone, Debug)]
struct AttemptVal<'a>(&'a CelAttempt);

fn attempt_field<'b, 'w>(v: &'b AttemptVal<'w>, f: &str) -> Result<CowVal<'b, 'w>, ExecutionError> {
    let a: &'w CelAttempt = v.0;
    match f {
        "provider" => text(&a.provider),
        "offer_id" => text(&a.offer_id),
        "failure_class" => text(&a.failure_class),
        "message" => text(&a.message),
        _ => Err(ExecutionError::no_such_key(f)),
    }
}
record_val!(AttemptVal, attempt_field);

/// `attempts`, built once per batch.
pub(crate) fn attempts_val(attempts: &[CelAttempt]) -> CelList<'_> {
    let items: Vec<Box<dyn Val + '_>> = attempts
        .iter()
        .map(|a| Box::new(AttemptVal(a)) as Box<dyn Val + '_>)
        .collect();
    CelList::from(items)
}

/// `workload`, with its lists and map built once per batch.
#[derive(Clone, Debug)]
pub(crate) struct WorkloadVal<'a> {
    w: &'a CelWorkload,
    gpu_models: CelList<'a>,
    regions: CelList<'a>,
    annotations: CelMap<'a>,
}

impl<'a> WorkloadVal<'a> {
    pub(crate) fn new(w: &'a CelWorkload) -> Self {
        let list = |items: &'a [String]| {
            let items: Vec<Box<dyn Val + 'a>> = items
                .iter()
                .map(|s| Box::new(CelString::from(s.as_str())) as _)
                .collect();
            CelList::from(items)
        };
        let annotations: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = w
            .annotations
            .iter()
            .map(|(k, v)| {
                (
                    CelMapKey::from(k.as_str()),
                    Box::new(CelString::from(v.as_str())) as _,
                )
            })
            .collect();
        WorkloadVal {
            w,
            gpu_models: list(&w.gpu_models),
            regions: list(&w.regions),
            annotations: CelMap::from(annotations),
        }
    }
}

fn workload_field<'b, 'w>(
    v: &'b WorkloadVal<'w>,
    f: &str,
) -> Result<CowVal<'b, 'w>, ExecutionError> {
    let w: &'w CelWorkload = v.w;
    match f {
        "gpu_count" => owned(CelInt::from(w.gpu_count)),
        "gpu_models" => Ok(CowVal::Borrowed(&v.gpu_models)),
        "max_price" => owned(CelDouble::from(w.max_price)),
        "capacity_type" => text(&w.capacity_type),
        "regions" => Ok(CowVal::Borrowed(&v.regions)),
        "image" => text(&w.image),
        "annotations" => Ok(CowVal::Borrowed(&v.annotations)),
        _ => Err(ExecutionError::no_such_key(f)),
    }
}
record_val!(WorkloadVal, workload_field);
