//! dispatch (to be written)
