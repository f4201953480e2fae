//! inferq's end-to-end tests, as one test binary: real `inferq` processes (the built binary),
//! real `redis-server`s (standalone, Cluster, Sentinel; Valkey too) and real HTTP gateways,
//! each started on free ports by the test kit or by [`common`].
//!
//! One module per area; `cargo test --release -p inferq --test e2e cluster::` runs one area.
//! They are one binary rather than twenty because each test binary is a separate optimised
//! build and link of the whole processor: twenty of them took most of CI's time budget.

mod common;
mod harness;

mod cli;
mod cluster;
mod dead_letter;
mod deploy;
mod durable_results;
mod eviction;
mod fair_share;
mod gates;
mod go_command_line;
mod go_payloads;
mod go_results;
mod go_v011;
mod go_worker;
mod hostile;
mod limits;
mod mixed_fleet;
mod poison;
mod processor;
mod prometheus;
mod pubsub;
mod reload;
mod residue;
mod router_broker;
mod security;
mod slack;
mod status;
mod tracing;
mod upgrade;
