//! The Batch API's end-to-end tests, in one test binary (one link instead of eight, which CI's
//! time budget notices): each module starts its own deployment from real parts (see
//! [`common`]) and drives it as a user would.

mod cluster;
mod common;
mod durability;
mod fair_share;
mod front;
mod front_go;
mod front_router;
mod front_sdk;
mod front_topologies;
mod hostile;
mod http;
mod model;
mod s3;
mod sdk;
mod sentinel;
mod tenants;
