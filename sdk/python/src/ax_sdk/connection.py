"""How the client and the worker reach a scheduler: its addresses, the bearer token and TLS.

An address is `http://host:port` (plaintext), `https://host:port` (TLS, verified against the
system's roots or a CA file) or a bare `host:port` (plaintext). The port defaults to 7070. A
token is sent on every call as the metadata `authorization: Bearer <token>`, which is how the
scheduler's `--auth tokens` reads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Tuple, Union
from urllib.parse import urlsplit

import grpc

DEFAULT_PORT = 7070

# Answers of up to this size are accepted: a large workflow's description exceeds gRPC's
# default of 4 MiB.
MAX_MESSAGE_BYTES = 64 << 20


class ConfigError(ValueError):
    """A connection setting is wrong; the message names the setting and the value."""


@dataclass(frozen=True)
class Endpoint:
    """One scheduler address, parsed."""

    address: str
    host: str
    port: int
    tls: bool

    @property
    def target(self) -> str:
        """The gRPC target (`host:port`, an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_endpoint(address: str) -> Endpoint:
    """Parses `http://host:port`, `https://host:port` or `host:port`."""
    text = address.strip()
    if not text:
        raise ConfigError("a scheduler address is empty")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ConfigError(
            f"scheduler address {address!r}: the scheme must be http:// or https://, not {parts.scheme}://"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"scheduler address {address!r}: expected scheme://host:port and nothing after it")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ConfigError(f"scheduler address {address!r}: the port is not a number from 1 to 65535") from None
    if not parts.hostname:
        raise ConfigError(f"scheduler address {address!r} names no host")
    return Endpoint(address=address.strip(), host=parts.hostname, port=port, tls=parts.scheme == "https")


def parse_endpoints(addresses: Union[str, Iterable[str]]) -> Tuple[Endpoint, ...]:
    """A comma-separated string or a list of addresses, each parsed; at least one."""
    if isinstance(addresses, str):
        addresses = addresses.split(",")
    endpoints = tuple(parse_endpoint(a) for a in addresses if a.strip())
    if not endpoints:
        raise ConfigError("no scheduler address given")
    return endpoints


def _read(path: Optional[str], what: str) -> Optional[bytes]:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read the {what} {path}: {error.strerror or error}") from None


def _check_token(token: str, source: str) -> str:
    token = token.strip()
    if not token:
        raise ConfigError(f"the token from {source} is empty")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise ConfigError(f"the token from {source} contains whitespace or control characters")
    return token


@dataclass(frozen=True)
class Credentials:
    """The token and the TLS files shared by every address of one client or worker.

    `tls_ca`: a PEM file of the CA that signed the schedulers' certificate (https:// addresses;
    the system's roots when unset). `tls_cert`/`tls_key`: a client certificate and its key, for a
    scheduler started with `--tls-client-ca` (a worker's certificate names its worker id).
    """

    token: Optional[str] = None
    tls_ca: Optional[str] = None
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    _ca_pem: Optional[bytes] = field(default=None, repr=False, compare=False)
    _cert_pem: Optional[bytes] = field(default=None, repr=False, compare=False)
    _key_pem: Optional[bytes] = field(default=None, repr=False, compare=False)

    @staticmethod
    def load(
        token: Optional[str] = None,
        token_file: Optional[str] = None,
        tls_ca: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
    ) -> "Credentials":
        """Checks the settings and reads the files once."""
        if token is not None and token_file is not None:
            raise ConfigError("give a token or a token file, not both")
        if token is not None:
            token = _check_token(token, "the token option")
        elif token_file is not None:
            raw = _read(token_file, "token file") or b""
            token = _check_token(raw.decode("utf-8", "replace"), f"token file {token_file}")
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("a client certificate needs both tls_cert and tls_key")
        return Credentials(
            token=token,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            _ca_pem=_read(tls_ca, "TLS CA file"),
            _cert_pem=_read(tls_cert, "TLS certificate"),
            _key_pem=_read(tls_key, "TLS key"),
        )

    @staticmethod
    def from_env() -> "Credentials":
        """AX_TOKEN or AX_TOKEN_FILE, AX_TLS_CA, AX_TLS_CERT and AX_TLS_KEY, as axctl reads them."""
        env = os.environ
        return Credentials.load(
            token=env.get("AX_TOKEN") or None,
            token_file=env.get("AX_TOKEN_FILE") or None,
            tls_ca=env.get("AX_TLS_CA") or None,
            tls_cert=env.get("AX_TLS_CERT") or None,
            tls_key=env.get("AX_TLS_KEY") or None,
        )

    def metadata(self) -> Sequence[Tuple[str, str]]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def channel(self, endpoint: Endpoint, options: Sequence[Tuple[str, object]] = ()) -> grpc.Channel:
        """A channel to `endpoint`: TLS for https://, plaintext otherwise."""
        opts = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            *options,
        ]
        if endpoint.tls:
            creds = grpc.ssl_channel_credentials(
                root_certificates=self._ca_pem,
                private_key=self._key_pem,
                certificate_chain=self._cert_pem,
            )
            channel = grpc.secure_channel(endpoint.target, creds, options=opts)
        else:
            channel = grpc.insecure_channel(endpoint.target, options=opts)
        if self.token:
            # Metadata rather than call credentials: gRPC sends call credentials only over TLS,
            # and a token on a loopback plaintext address is a valid setup.
            channel = grpc.intercept_channel(channel, _Metadata(self.metadata()))
        return channel


    def aio_channel(self, endpoint: Endpoint) -> "grpc.aio.Channel":
        """An asyncio channel to `endpoint`; its callers send `metadata()` with each call."""
        import grpc.aio

        opts = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        if endpoint.tls:
            creds = grpc.ssl_channel_credentials(
                root_certificates=self._ca_pem,
                private_key=self._key_pem,
                certificate_chain=self._cert_pem,
            )
            return grpc.aio.secure_channel(endpoint.target, creds, options=opts)
        return grpc.aio.insecure_channel(endpoint.target, options=opts)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, details: Any, metadata: Sequence[Tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = tuple(metadata)
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class _Metadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds fixed metadata (the bearer token) to every call."""

    def __init__(self, metadata: Sequence[Tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)

    def _details(self, details: Any) -> _CallDetails:
        return _CallDetails(details, tuple(details.metadata or ()) + self._metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)
