/**
 * A fake scheduler for the worker's and the client's unit tests: a real gRPC server on loopback
 * (grpc-js) serving WorkerService and ControlService from the same generated descriptors, whose
 * answers each test scripts. Every worker stream is recorded: its metadata and each frame.
 */

import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary, type DescMessage, type DescService, type MessageInitShape } from "@bufbuild/protobuf";

import { ControlService } from "../src/gen/ax/v1/control_pb.js";
import {
  RegisteredSchema,
  SchedulerMessageSchema,
  WorkerService,
  type SchedulerMessage,
  type WorkerMessage,
} from "../src/gen/ax/v1/worker_pb.js";
import { GUARD_MS } from "./helpers.js";

type Handler = grpc.UntypedHandleCall;

/** A grpc-js service definition of a generated service. */
export function serviceDefinition(service: DescService): grpc.ServiceDefinition {
  const definition: Record<string, grpc.MethodDefinition<unknown, unknown>> = {};
  for (const method of service.methods) {
    const message = (schema: DescMessage) => ({
      serialize: (value: unknown) => Buffer.from(toBinary(schema, value as never)),
      deserialize: (bytes: Buffer) => fromBinary(schema, new Uint8Array(bytes)),
    });
    definition[method.localName] = {
      path: `/${service.typeName}/${method.name}`,
      requestStream: method.methodKind === "client_streaming" || method.methodKind === "bidi_streaming",
      responseStream: method.methodKind === "server_streaming" || method.methodKind === "bidi_streaming",
      requestSerialize: message(method.input).serialize,
      requestDeserialize: message(method.input).deserialize,
      responseSerialize: message(method.output).serialize,
      responseDeserialize: message(method.output).deserialize,
    };
  }
  return definition as grpc.ServiceDefinition;
}

/** One worker stream as the fake saw it. */
export class FakeStream {
  readonly call: grpc.ServerDuplexStream<WorkerMessage, SchedulerMessage>;
  readonly frames: WorkerMessage[] = [];
  readonly authorization: string;
  ended = false;
  private waiters: Array<() => void> = [];

  constructor(call: grpc.ServerDuplexStream<WorkerMessage, SchedulerMessage>) {
    this.call = call;
    this.authorization = String(call.metadata.get("authorization")[0] ?? "");
    call.on("data", (frame: WorkerMessage) => {
      this.frames.push(frame);
      this.wake();
    });
    const end = () => {
      this.ended = true;
      this.wake();
    };
    call.on("end", end);
    call.on("error", end);
    call.on("cancelled", end);
    call.on("close", end);
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const waiter of waiters) waiter();
  }

  send(body: MessageInitShape<typeof SchedulerMessageSchema>["body"]): void {
    this.call.write(create(SchedulerMessageSchema, { body } as MessageInitShape<typeof SchedulerMessageSchema>));
  }

  /** Answers the Register with Registered (the test's fields). */
  registered(fields: MessageInitShape<typeof RegisteredSchema> = {}): void {
    this.send({ case: "registered", value: create(RegisteredSchema, { schedulerNode: "fake", ...fields }) });
  }

  /** Ends the stream with a status, as a node that went away. */
  fail(code = grpc.status.UNAVAILABLE, details = "the fake scheduler ends the stream"): void {
    if (this.ended) return;
    this.ended = true;
    // grpc-js sends an 'error' emitted on a server stream as the call's status.
    this.call.emit("error", { code, details });
  }

  /** The frames of one kind, in order. */
  of<K extends NonNullable<WorkerMessage["body"]["case"]>>(kind: K): Array<Extract<WorkerMessage["body"], { case: K }>["value"]> {
    return this.frames.filter((f) => f.body.case === kind).map((f) => f.body.value as never);
  }

  /** Waits until `predicate` holds over the frames so far. */
  async until(predicate: (stream: FakeStream) => boolean, what: string, guardMs = GUARD_MS): Promise<void> {
    const deadline = Date.now() + guardMs;
    while (!predicate(this)) {
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new Error(`waited ${guardMs} ms for ${what}; frames: ${this.frames.map((f) => f.body.case).join(", ")}`);
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(left, 100));
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }
}

export interface FakeOptions {
  /** What to do with a new worker stream (default: answer Registered). */
  onConnect?: (stream: FakeStream) => void;
  /** ControlService handlers by method local name (getRun, triggerWorkflow, watchRun, ...). */
  control?: Record<string, Handler>;
  credentials?: grpc.ServerCredentials;
}

/** A fake scheduler on 127.0.0.1. */
export class FakeScheduler {
  readonly streams: FakeStream[] = [];
  private readonly server = new grpc.Server();
  private waiters: Array<() => void> = [];
  port = 0;

  private constructor() {}

  static async start(options: FakeOptions = {}): Promise<FakeScheduler> {
    const fake = new FakeScheduler();
    fake.server.addService(serviceDefinition(WorkerService), {
      connect: (call: grpc.ServerDuplexStream<WorkerMessage, SchedulerMessage>) => {
        const stream = new FakeStream(call);
        fake.streams.push(stream);
        const waiters = fake.waiters;
        fake.waiters = [];
        for (const waiter of waiters) waiter();
        if (options.onConnect) options.onConnect(stream);
        else void stream.until((s) => s.frames.length > 0, "the Register").then(() => stream.registered(), () => {});
      },
    });
    const unimplemented: Handler = ((call: { emit?: unknown }, callback?: grpc.sendUnaryData<unknown>) => {
      const error = { code: grpc.status.UNIMPLEMENTED, details: "not in the fake" };
      if (callback) callback(error);
      else (call as grpc.ServerWritableStream<unknown, unknown>).emit("error", error);
    }) as Handler;
    const control: Record<string, Handler> = {};
    for (const method of ControlService.methods) control[method.localName] = options.control?.[method.localName] ?? unimplemented;
    fake.server.addService(serviceDefinition(ControlService), control);
    fake.port = await new Promise<number>((resolve, reject) =>
      fake.server.bindAsync(
        "127.0.0.1:0",
        options.credentials ?? grpc.ServerCredentials.createInsecure(),
        (error, port) => (error ? reject(error) : resolve(port)),
      ),
    );
    return fake;
  }

  get address(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** The `n`-th stream (0-based), once it is there. */
  async stream(n: number): Promise<FakeStream> {
    const deadline = Date.now() + GUARD_MS;
    while (this.streams.length <= n) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`waited ${GUARD_MS} ms for worker stream ${n + 1}`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(left, 100));
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    return this.streams[n]!;
  }

  async stop(): Promise<void> {
    for (const stream of this.streams) stream.fail(grpc.status.UNAVAILABLE, "the fake scheduler stops");
    this.server.forceShutdown();
  }
}

/** A logger that keeps every message, for assertions. */
export function recordingLogger(): { messages: string[]; logger: import("../src/log.js").Logger } {
  const messages: string[] = [];
  const keep = (m: string) => void messages.push(m);
  return { messages, logger: { debug: () => {}, info: keep, warn: keep, error: keep } };
}
