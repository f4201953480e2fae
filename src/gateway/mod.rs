//! gateway (to be written)
