"""The generated protobuf modules, under short names: `pb.control`, `pb.worker`, `pb.types`."""

from ._pb import control_pb2 as control
from ._pb import types_pb2 as types
from ._pb import worker_pb2 as worker

__all__ = ["control", "types", "worker"]
