"""The package as pip sees it: an sdist that builds a wheel away from the repository, a wheel
carrying its stubs and py.typed, and dependency floors that the generated code accepts."""

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]


def _build(args, cwd, out):
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), *args, "."],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_sdist_builds_a_wheel_on_its_own_with_floors_the_stubs_accept(tmp_path):
    pytest.importorskip("build", reason="the build package is not installed (.ci/requirements.txt has it)")
    _build(["--sdist"], HERE, tmp_path / "sdist")
    (sdist,) = (tmp_path / "sdist").glob("ax_sdk-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        root = names[0].split("/")[0]
        assert f"{root}/proto/ax/v1/worker.proto" in names
        assert f"{root}/src/ax_sdk/py.typed" in names
        assert not any("/_pb/" in name for name in names), "generated stubs are not shipped in the sdist"
        # Away from the repository: nothing above the unpacked sdist holds proto files.
        away = tmp_path / "elsewhere"
        archive.extractall(away, filter="data")
    _build(["--wheel"], away / root, tmp_path / "wheel")
    (wheel,) = (tmp_path / "wheel").glob("ax_sdk-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        files = archive.namelist()
        assert "ax_sdk/py.typed" in files
        assert "ax_sdk/_pb/control_pb2_grpc.py" in files and "ax_sdk/_pb/control_pb2.pyi" in files
        metadata = archive.read(next(f for f in files if f.endswith(".dist-info/METADATA"))).decode()
        messages = archive.read("ax_sdk/_pb/types_pb2.py").decode()
        services = archive.read("ax_sdk/_pb/worker_pb2_grpc.py").decode()
    gencode = re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+)", messages)
    grpc_generated = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", services)
    assert gencode and grpc_generated
    requires = sorted(line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: "))
    assert requires == [f"grpcio>={grpc_generated.group(1)}", f"protobuf>={'.'.join(gencode.groups())}"]
    # One version: the package's, in the file name and the metadata.
    from ax_sdk.version import __version__

    assert f"Version: {__version__}\n" in metadata and wheel.name.startswith(f"ax_sdk-{__version__}-")
    shutil.rmtree(away)
