//! sim (to be written)
