/**
 * The TypeScript SDK of ax: a control API client (`Client`), a worker of `worker.proto`
 * (`Worker`) that runs shell tasks and async functions as tasks (`Tasks`, typed `inputs`), and a
 * workflow builder (`Workflow`). See README.md.
 */

export { Client, AxError, WaitTimeout, encodeParams, retryDelayMs, DEFAULT_SETTLE_MS, DEFAULT_RETRY_FOR_MS } from "./client.js";
export type {
  ClientOptions,
  LogLine,
  MarkOptions,
  MarkState,
  RerunOptions,
  TriggerOptions,
  WaitOptions,
  WorkflowSource,
} from "./client.js";
export { ConfigError, Credentials, parseEndpoint, parseEndpoints, DEFAULT_PORT } from "./connection.js";
export type { CredentialOptions, Endpoint } from "./connection.js";
export { DurationError, parseDurationMs, parseDurationNs } from "./duration.js";
export {
  Cancelled,
  COMMAND,
  TaskContext,
  Tasks,
  functionCall,
  isMain,
  isTaskDefinition,
  shellWords,
} from "./functions.js";
export type { TaskDefinition, TaskOptions } from "./functions.js";
export { ConversionError, InputError, bindInputs, fromText, param, t, upstream, asDecoder } from "./inputs.js";
export type {
  Decoder,
  Input,
  InputSpec,
  Inputs,
  InputType,
  ObjectOf,
  ParamInput,
  ParseSchema,
  Schema,
  SchemaType,
  TaskRef,
  UpstreamInput,
} from "./inputs.js";
export { silentLogger, stderrLogger } from "./log.js";
export type { Level, Logger } from "./log.js";
export {
  MAX_ATTEMPT_BYTES,
  OutputsError,
  isOutputName,
  outputsFromReturn,
  paramEnvName,
  parseOutputs,
  renderOutputs,
  toJson,
  upstreamEnvName,
} from "./outputs.js";
export { instanceEnded, runEnded, workflowParams } from "./runs.js";
export type { Attempt, Instance, InstanceState, Run, RunState, Trigger, Triggered, WorkflowParam } from "./runs.js";
export { VERSION } from "./version.js";
export { Worker, WorkerRefused, WORKER_VERSION } from "./worker.js";
export type { WorkerOptions } from "./worker.js";
export { Workflow } from "./workflow.js";
export type { AddOptions, FunctionTaskOptions, Routing, TaskFields, TriggerRule, WorkflowOptions, WorkflowTask } from "./workflow.js";
export * as pb from "./pb.js";
