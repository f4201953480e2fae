//! testkit (to be written)
