//! The orphan sweeper (being written).
