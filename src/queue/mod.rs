//! queue (to be written)
