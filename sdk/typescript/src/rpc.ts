/**
 * gRPC calls of the generated service descriptors (`src/gen`, made by protoc-gen-es from
 * `proto/`) over `@grpc/grpc-js`: a method's path is `/<package.Service>/<Method>`, its messages
 * go over the wire as protobuf-es binary. Typed by the descriptors, so a request has the shape
 * of its message and an answer is the generated type.
 */

import * as grpc from "@grpc/grpc-js";
import {
  create,
  fromBinary,
  toBinary,
  type DescMessage,
  type DescMethod,
  type MessageInitShape,
  type MessageShape,
} from "@bufbuild/protobuf";

import { Credentials, type Endpoint } from "./connection.js";

/** A method of a generated service (`ControlService.method.getRun`). */
export type Method<I extends DescMessage = DescMessage, O extends DescMessage = DescMessage> = DescMethod & {
  readonly input: I;
  readonly output: O;
};

export function methodPath(method: DescMethod): string {
  return `/${method.parent.typeName}/${method.name}`;
}

function serializer<D extends DescMessage>(schema: D): (message: MessageShape<D>) => Buffer {
  return (message) => {
    const bytes = toBinary(schema, message);
    return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  };
}

function deserializer<D extends DescMessage>(schema: D): (bytes: Buffer) => MessageShape<D> {
  return (bytes) => fromBinary(schema, new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength));
}

/** The status code names, by number (grpc.status). */
export function statusName(code: number): string {
  const name = grpc.status[code];
  return typeof name === "string" ? name : `CODE_${code}`;
}

/** One channel to one endpoint, and the calls made on it. */
export class Channel {
  readonly endpoint: Endpoint;
  private readonly client: grpc.Client;
  private readonly credentials: Credentials;

  constructor(endpoint: Endpoint, credentials: Credentials, options: grpc.ChannelOptions = {}) {
    this.endpoint = endpoint;
    this.credentials = credentials;
    this.client = new grpc.Client(endpoint.target, credentials.channelCredentials(endpoint), {
      ...Credentials.channelOptions(),
      ...options,
    });
  }

  close(): void {
    this.client.close();
  }

  private options(timeoutMs?: number): grpc.CallOptions {
    return timeoutMs === undefined || !Number.isFinite(timeoutMs) ? {} : { deadline: Date.now() + timeoutMs };
  }

  unary<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    request: MessageInitShape<I>,
    timeoutMs?: number,
  ): Promise<MessageShape<O>> {
    return new Promise((resolve, reject) => {
      this.client.makeUnaryRequest(
        methodPath(method),
        serializer(method.input),
        deserializer(method.output),
        create(method.input, request),
        this.credentials.metadata(),
        this.options(timeoutMs),
        (error: grpc.ServiceError | null, value?: MessageShape<O>) => {
          if (error) reject(error);
          else resolve(value as MessageShape<O>);
        },
      );
    });
  }

  /** A server-streaming call: an async-iterable stream of answers; a failed call throws from it. */
  serverStream<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    request: MessageInitShape<I>,
    timeoutMs?: number,
  ): grpc.ClientReadableStream<MessageShape<O>> {
    return this.client.makeServerStreamRequest(
      methodPath(method),
      serializer(method.input),
      deserializer(method.output),
      create(method.input, request),
      this.credentials.metadata(),
      this.options(timeoutMs),
    );
  }

  /** A bidirectional stream. */
  bidiStream<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
  ): grpc.ClientDuplexStream<MessageShape<I>, MessageShape<O>> {
    return this.client.makeBidiStreamRequest(
      methodPath(method),
      serializer(method.input),
      deserializer(method.output),
      this.credentials.metadata(),
      {},
    );
  }
}

/** Whether `error` is a gRPC status error (from a call). */
export function isServiceError(error: unknown): error is grpc.ServiceError {
  return (
    error instanceof Error &&
    typeof (error as Partial<grpc.ServiceError>).code === "number" &&
    (error as Partial<grpc.ServiceError>).metadata instanceof grpc.Metadata
  );
}
