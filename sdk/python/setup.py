"""Build hook of the ax Python SDK: generates the gRPC stubs from ax's proto files.

Nothing generated is committed. While a wheel is built (`pip install ./sdk/python`, `pip wheel`,
or from the sdist), grpcio-tools compiles `ax/v1/*.proto` and `build_py` writes the modules into
the build output as the package `ax_sdk._pb`; an editable install (`pip install -e`) writes them
into `src/ax_sdk/_pb/` instead, which is gitignored.

The proto files are found in `$AX_PROTO_DIR`, else `../../proto` (the repository's `proto/`),
else `proto/` beside this file (where the sdist carries them: `sdist` copies them in).

The dependency floors are read from what was generated: generated messages refuse a protobuf
runtime older than the protoc that wrote them, and generated services a grpcio older than the
grpcio-tools, so `protobuf>=` and `grpcio>=` are those versions, whichever grpcio-tools builds.
"""

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
PROTOS = ["ax/v1/types.proto", "ax/v1/worker.proto", "ax/v1/control.proto"]


def proto_root() -> Path:
    configured = os.environ.get("AX_PROTO_DIR")
    candidates = [Path(configured)] if configured else [HERE.parent.parent / "proto", HERE / "proto"]
    for root in candidates:
        if all((root / name).is_file() for name in PROTOS):
            return root
    searched = ", ".join(str(c) for c in candidates)
    raise SystemExit(
        f"ax-sdk build: the proto files ({', '.join(PROTOS)}) are not under {searched}; "
        "build from the ax repository (pip install ./sdk/python) or set AX_PROTO_DIR"
    )


def generate(target: Path) -> None:
    """Writes the stubs of PROTOS into `target` as one flat package.

    protoc names the modules after the proto paths (`from ax.v1 import types_pb2`); those imports
    are rewritten to relative ones so the stubs live inside `ax_sdk._pb` and claim no top-level
    `ax` package.
    """
    try:
        from grpc_tools import protoc
    except ImportError as error:
        raise SystemExit(
            "ax-sdk build: grpcio-tools is needed to generate the gRPC stubs "
            f"(pip install grpcio-tools): {error}"
        )
    import grpc_tools

    root = proto_root()
    well_known = Path(grpc_tools.__file__).resolve().parent / "_proto"
    with tempfile.TemporaryDirectory() as scratch:
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{well_known}",
            f"--python_out={scratch}",
            f"--pyi_out={scratch}",
            f"--grpc_python_out={scratch}",
            *PROTOS,
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"ax-sdk build: protoc failed on {', '.join(PROTOS)} in {root}")
        target.mkdir(parents=True, exist_ok=True)
        generated = Path(scratch) / "ax" / "v1"
        for source in sorted(generated.iterdir()):
            if source.suffix not in (".py", ".pyi"):
                continue
            text = source.read_text(encoding="utf-8")
            text = re.sub(r"^from ax\.v1 import ", "from . import ", text, flags=re.MULTILINE)
            (target / source.name).write_text(text, encoding="utf-8")
        (target / "__init__.py").write_text(
            f'"""gRPC stubs generated from {", ".join(PROTOS)} at build time."""\n',
            encoding="utf-8",
        )


_GENERATED = None


def generated() -> Path:
    """The stubs, generated once per build into a scratch directory."""
    global _GENERATED
    if _GENERATED is None:
        _GENERATED = Path(tempfile.mkdtemp(prefix="ax-sdk-stubs-"))
        generate(_GENERATED)
    return _GENERATED


def dependency_floors() -> list:
    """`grpcio>=` and `protobuf>=` as the generated code checks them at import."""
    stubs = generated()
    messages = (stubs / "types_pb2.py").read_text(encoding="utf-8")
    found = re.search(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+)",
        messages,
    )
    services = (stubs / "worker_pb2_grpc.py").read_text(encoding="utf-8")
    grpc_found = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", services)
    if found is None or grpc_found is None:
        raise SystemExit("ax-sdk build: cannot read the protobuf and grpcio versions the stubs need")
    return [f"grpcio>={grpc_found.group(1)}", f"protobuf>={'.'.join(found.groups())}"]


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            target = HERE / "src" / "ax_sdk" / "_pb"
        else:
            target = Path(self.build_lib) / "ax_sdk" / "_pb"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(generated(), target)
        print(f"ax-sdk: generated gRPC stubs in {target}", file=sys.stderr)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if not getattr(self, "editable_mode", False):
            generated = Path(self.build_lib) / "ax_sdk" / "_pb"
            outputs.extend(str(p) for p in generated.glob("*.py*"))
        return outputs


class SdistWithProtos(sdist):
    """The sdist carries the proto files, so a wheel builds from it anywhere."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = proto_root()
        for name in PROTOS:
            target = Path(base_dir) / "proto" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / name, target)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProtos}, install_requires=dependency_floors())
