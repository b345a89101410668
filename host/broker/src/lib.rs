//! The resource broker: an offer catalog over every enabled provider, a planner that applies
//! constraints and policies, a fallback ladder for failed rentals, and the price and budget guards
//! that keep spending within what the Pod and the cluster allow.
//!
//! It is provider-neutral and knows nothing of Kubernetes: the virtual node consumes it.
