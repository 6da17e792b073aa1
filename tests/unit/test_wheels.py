"""packaging/build_wheels.py: one wheel per architecture, tagged for it, holding the objects built for it
(today the same bytes as the committed x86 build, which `make check-bpf` holds them to), the license texts
and the core requirements only. The arm64 wheel is built here; the x86_64 one by the image build
(packaging/image/build.py, tests/privileged/test_image.py), which checks the same with check_wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMMITTED = {path.name: path.read_bytes() for path in (REPO / "src/netsleuth/_generated").glob("*.bpf.o")}


def check_wheel(wheel_path: Path, machine: str) -> None:
    """What every wheel must hold; `machine` is its uname -m (x86_64, aarch64)."""
    assert wheel_path.name == f"netsleuth-0.1.0-py3-none-manylinux2014_{machine}.manylinux_2_17_{machine}.whl"
    with zipfile.ZipFile(wheel_path) as wheel:
        names = wheel.namelist()
        objects = {name.rsplit("/", 1)[1]: wheel.read(name) for name in names if name.endswith(".bpf.o")}
        metadata = wheel.read("netsleuth-0.1.0.dist-info/METADATA").decode().splitlines()
        tags = [
            line
            for line in wheel.read("netsleuth-0.1.0.dist-info/WHEEL").decode().splitlines()
            if "Tag" in line
        ]
        assert wheel.testzip() is None
    assert tags == [f"Tag: py3-none-manylinux_2_17_{machine}", f"Tag: py3-none-manylinux2014_{machine}"]
    assert objects == COMMITTED
    assert {
        "netsleuth-0.1.0.dist-info/licenses/LICENSES/GPL-2.0-only.txt",
        "netsleuth-0.1.0.dist-info/licenses/LICENSES/Apache-2.0.txt",
    } <= set(names)
    assert "License-Expression: Apache-2.0 AND GPL-2.0-only" in metadata
    unconditional = [line for line in metadata if line.startswith("Requires-Dist") and ";" not in line]
    assert not [line for line in unconditional if any(word in line for word in ("nats", "fastapi", "crypto"))]
    assert not [name for name in names if name.startswith("tests/")]


def test_the_arm64_wheel(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "packaging/build_wheels.py"), "--arch", "arm64", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("*.whl")
    assert result.stdout == f"{wheel}\n"
    check_wheel(wheel, "aarch64")
