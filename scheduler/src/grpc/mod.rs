//! The gRPC edge: protobuf in, domain calls, protobuf out.

pub mod control;
pub mod convert;
pub mod views;
pub mod worker;
