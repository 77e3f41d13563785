//! The gRPC edge: protobuf in, domain calls, protobuf out.

pub mod control;
pub mod convert;
mod sub_workflows;
pub mod views;
pub mod worker;
