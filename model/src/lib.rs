//! The order protocol checked over every interleaving: the model and its
//! properties live in `tests/protocol_model.rs` (run by the test command,
//! `cargo nextest run -p protocol_model`). This library is empty; the crate
//! exists so that the model alone is built optimised in the dev profile.
