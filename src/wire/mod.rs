//! wire (to be written)
