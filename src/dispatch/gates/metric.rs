//! Gates (being written).

use std::sync::Arc;

use super::{Gate, GateEnv, GateError};
use crate::config::GateSpec;

/// Builds a gate of this family.
pub fn build(spec: &GateSpec, _env: &GateEnv) -> Result<Arc<dyn Gate>, GateError> {
    Err(GateError::Failed {
        gate: "unbuilt",
        reason: format!("{} is not implemented", spec.kind.as_str()),
    })
}
