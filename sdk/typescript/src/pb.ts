/**
 * The generated protobuf types and schemas of `proto/ax/v1` (protoc-gen-es, made at build time),
 * for the fields the typed views leave out: `import { pb } from "ax-sdk"`, `pb.control.RunState`.
 */

export * as control from "./gen/ax/v1/control_pb.js";
export * as types from "./gen/ax/v1/types_pb.js";
export * as worker from "./gen/ax/v1/worker_pb.js";
