//! Prometheus metrics of the node (being written; see the README for the names as they land).
