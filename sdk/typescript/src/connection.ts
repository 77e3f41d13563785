/**
 * How the client and the worker reach a scheduler: its addresses, the bearer token and TLS.
 *
 * An address is `http://host:port` (plaintext), `https://host:port` (TLS, verified against the
 * system's roots or a CA file) or a bare `host:port` (plaintext). The port defaults to 7070. A
 * token is sent on every call as the metadata `authorization: Bearer <token>`, which is how the
 * scheduler's `--auth tokens` reads it.
 */

import { readFileSync } from "node:fs";
import * as grpc from "@grpc/grpc-js";

export const DEFAULT_PORT = 7070;

/** Answers of up to this size are accepted: a large workflow's description exceeds gRPC's 4 MiB. */
export const MAX_MESSAGE_BYTES = 64 << 20;

/** A connection setting is wrong; the message names the setting and the value. */
export class ConfigError extends Error {
  override name = "ConfigError";
}

/** One scheduler address, parsed. */
export interface Endpoint {
  /** As given (trimmed). */
  readonly address: string;
  readonly host: string;
  readonly port: number;
  readonly tls: boolean;
  /** The gRPC target: `host:port`, an IPv6 host in brackets. */
  readonly target: string;
}

/** Parses `http://host:port`, `https://host:port` or `host:port`. */
export function parseEndpoint(address: string): Endpoint {
  const text = address.trim();
  if (!text) throw new ConfigError("a scheduler address is empty");
  const withScheme = text.includes("://") ? text : `http://${text}`;
  const scheme = withScheme.slice(0, withScheme.indexOf("://"));
  if (scheme !== "http" && scheme !== "https") {
    throw new ConfigError(
      `scheduler address "${address}": the scheme must be http:// or https://, not ${scheme}://`,
    );
  }
  const authority = withScheme.slice(scheme.length + 3);
  const slash = authority.search(/[/?#]/);
  if (slash >= 0 && authority.slice(slash) !== "/") {
    throw new ConfigError(`scheduler address "${address}": expected scheme://host:port and nothing after it`);
  }
  const hostPort = slash >= 0 ? authority.slice(0, slash) : authority;
  let host: string;
  let portText: string | undefined;
  if (hostPort.startsWith("[")) {
    const close = hostPort.indexOf("]");
    if (close < 0) throw new ConfigError(`scheduler address "${address}": an IPv6 host needs its closing ]`);
    host = hostPort.slice(1, close);
    const after = hostPort.slice(close + 1);
    if (after && !after.startsWith(":")) {
      throw new ConfigError(`scheduler address "${address}": expected scheme://host:port and nothing after it`);
    }
    portText = after ? after.slice(1) : undefined;
  } else {
    const colon = hostPort.lastIndexOf(":");
    host = colon >= 0 ? hostPort.slice(0, colon) : hostPort;
    portText = colon >= 0 ? hostPort.slice(colon + 1) : undefined;
  }
  if (!host) throw new ConfigError(`scheduler address "${address}" names no host`);
  let port = DEFAULT_PORT;
  if (portText !== undefined && portText !== "") {
    if (!/^[0-9]{1,5}$/.test(portText) || Number(portText) < 1 || Number(portText) > 65535) {
      throw new ConfigError(`scheduler address "${address}": the port is not a number from 1 to 65535`);
    }
    port = Number(portText);
  }
  const target = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
  return { address: text, host, port, tls: scheme === "https", target };
}

/** A comma-separated string or a list of addresses, each parsed; at least one. */
export function parseEndpoints(addresses: string | readonly string[]): Endpoint[] {
  const list = typeof addresses === "string" ? addresses.split(",") : addresses;
  const endpoints = list.filter((a) => a.trim()).map(parseEndpoint);
  if (endpoints.length === 0) throw new ConfigError("no scheduler address given");
  return endpoints;
}

/** What a client or a worker authenticates with. Paths are read once, when the SDK starts. */
export interface CredentialOptions {
  /** A bearer token, sent as `authorization: Bearer <token>`. */
  token?: string | undefined;
  /** A file holding the token (one line). */
  tokenFile?: string | undefined;
  /** A PEM file of the CA that signed the schedulers' certificate (https:// addresses). */
  tlsCa?: string | undefined;
  /** A client certificate and its key, for a scheduler started with `--tls-client-ca`. */
  tlsCert?: string | undefined;
  tlsKey?: string | undefined;
}

function readSetting(path: string, what: string): Buffer {
  try {
    return readFileSync(path);
  } catch (error) {
    const reason = (error as NodeJS.ErrnoException).code === "ENOENT" ? "no such file" : String((error as Error).message);
    throw new ConfigError(`cannot read the ${what} ${path}: ${reason}`);
  }
}

function checkToken(token: string, source: string): string {
  const trimmed = token.trim();
  if (!trimmed) throw new ConfigError(`the token from ${source} is empty`);
  // Printable ASCII without spaces: anything else cannot be an HTTP/2 header value.
  if (!/^[\x21-\x7e]+$/.test(trimmed)) {
    throw new ConfigError(`the token from ${source} contains whitespace or control characters`);
  }
  return trimmed;
}

/** The token and the TLS files shared by every address of one client or worker. */
export class Credentials {
  readonly token: string | undefined;
  private readonly ca: Buffer | undefined;
  private readonly cert: Buffer | undefined;
  private readonly key: Buffer | undefined;

  private constructor(token: string | undefined, ca?: Buffer, cert?: Buffer, key?: Buffer) {
    this.token = token;
    this.ca = ca;
    this.cert = cert;
    this.key = key;
  }

  /** Checks the settings and reads the files once. */
  static load(options: CredentialOptions = {}): Credentials {
    let token: string | undefined;
    if (options.token !== undefined && options.tokenFile !== undefined) {
      throw new ConfigError("give a token or a token file, not both");
    }
    if (options.token !== undefined) {
      token = checkToken(options.token, "the token option");
    } else if (options.tokenFile !== undefined) {
      const raw = readSetting(options.tokenFile, "token file").toString("utf8");
      token = checkToken(raw, `token file ${options.tokenFile}`);
    }
    if ((options.tlsCert === undefined) !== (options.tlsKey === undefined)) {
      throw new ConfigError("a client certificate needs both tlsCert and tlsKey");
    }
    return new Credentials(
      token,
      options.tlsCa === undefined ? undefined : readSetting(options.tlsCa, "TLS CA file"),
      options.tlsCert === undefined ? undefined : readSetting(options.tlsCert, "TLS certificate"),
      options.tlsKey === undefined ? undefined : readSetting(options.tlsKey, "TLS key"),
    );
  }

  /** AX_TOKEN or AX_TOKEN_FILE, AX_TLS_CA, AX_TLS_CERT and AX_TLS_KEY, as axctl reads them. */
  static fromEnv(env: NodeJS.ProcessEnv = process.env): CredentialOptions {
    const get = (name: string) => (env[name] ? env[name] : undefined);
    const token = get("AX_TOKEN");
    return {
      token,
      tokenFile: token === undefined ? get("AX_TOKEN_FILE") : undefined,
      tlsCa: get("AX_TLS_CA"),
      tlsCert: get("AX_TLS_CERT"),
      tlsKey: get("AX_TLS_KEY"),
    };
  }

  /** The metadata every call carries: the bearer token, when there is one. */
  metadata(): grpc.Metadata {
    const metadata = new grpc.Metadata();
    if (this.token) metadata.set("authorization", `Bearer ${this.token}`);
    return metadata;
  }

  /** The channel credentials for `endpoint`: TLS for https://, plaintext otherwise. */
  channelCredentials(endpoint: Endpoint): grpc.ChannelCredentials {
    if (!endpoint.tls) return grpc.credentials.createInsecure();
    return grpc.credentials.createSsl(this.ca ?? null, this.key ?? null, this.cert ?? null);
  }

  /** Channel options: message sizes, and keepalive pings so a dead connection shows. */
  static channelOptions(): grpc.ChannelOptions {
    return {
      "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
      "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
      // Each Client and Worker has channels of its own, not shared with other code.
      "grpc.use_local_subchannel_pool": 1,
    };
  }
}
