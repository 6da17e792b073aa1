"""One netsleuth wheel per architecture, each holding the BPF objects built for that architecture.

    .venv/bin/python packaging/build_wheels.py [--out dist] [--arch x86 --arch arm64]

The Python is pure, so setuptools alone would make one `py3-none-any` wheel, which pip would also install on
s390x (big-endian: the little-endian objects cannot load there) or riscv64, where nothing was built or
checked. So: build that wheel once, then for each architecture build the objects with clang
-D__TARGET_ARCH_<arch> (`make bpf-objects`, the Makefile's one set of flags), put them in the wheel's
netsleuth/_generated/ and tag it for that architecture's Linux (`wheel unpack` / `wheel pack`, which rewrite
RECORD). Each architecture's objects are checked against its Debian kernel BTF by `make test`
(tests/unit/test_core_relocations.py).

The tag is manylinux_2_17 (+ its older spelling manylinux2014): the wheel links nothing against glibc (libbpf
is the system's libbpf1, opened through ctypes), so the oldest manylinux is the truthful floor.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The Makefile's BPF architecture (-D__TARGET_ARCH_...) -> the wheel's platform tags.
PLATFORM_TAGS = {
    "x86": ("manylinux_2_17_x86_64", "manylinux2014_x86_64"),
    "arm64": ("manylinux_2_17_aarch64", "manylinux2014_aarch64"),
}


def _run(*argv: str | Path, cwd: Path = REPO) -> str:
    result = subprocess.run([str(arg) for arg in argv], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(map(str, argv))} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def build_pure_wheel(scratch: Path) -> Path:
    # In this venv (the dev extra has setuptools and wheel): an isolated build would install them each time.
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--quiet",
        "--wheel-dir",
        scratch,
        REPO,
    )
    (wheel,) = scratch.glob("netsleuth-*.whl")
    return wheel


def arch_wheel(pure_wheel: Path, arch: str, scratch: Path, out: Path) -> Path:
    """A copy of `pure_wheel` with the objects built for `arch`, tagged for it."""
    objects = scratch / f"objects-{arch}"
    _run("make", "-s", "--no-print-directory", "bpf-objects", f"ARCH={arch}", f"BPF_OUT={objects}")
    unpacked = scratch / f"unpacked-{arch}"
    _run(sys.executable, "-m", "wheel", "unpack", "--dest", unpacked, pure_wheel)
    (tree,) = unpacked.iterdir()
    generated = tree / "netsleuth" / "_generated"
    shipped = {path.name for path in generated.glob("*.bpf.o")}
    built = {path.name for path in objects.glob("*.bpf.o")}
    if shipped != built:
        sys.exit(f"the wheel ships {sorted(shipped)} but bpf/ builds {sorted(built)}: run 'make bpf'")
    for name in sorted(built):
        shutil.copyfile(objects / name, generated / name)
    (metadata,) = tree.glob("*.dist-info")
    wheel_file = metadata / "WHEEL"
    # An email-style header block: drop the old tags and the blank line that ends it.
    lines = [line for line in wheel_file.read_text().splitlines() if line and not line.startswith("Tag:")]
    lines += [f"Tag: py3-none-{platform}" for platform in PLATFORM_TAGS[arch]]
    wheel_file.write_text("\n".join(lines) + "\n")
    packed = _run(sys.executable, "-m", "wheel", "pack", "--dest-dir", out, tree)
    name = packed.strip().splitlines()[-1].split()[-1]  # "Repacking wheel as dist/x.whl...OK"
    return out / Path(name.removesuffix("...OK")).name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="where the wheels go (default dist/)")
    parser.add_argument(
        "--arch", action="append", choices=sorted(PLATFORM_TAGS), help="default: every architecture"
    )
    arguments = parser.parse_args()
    out: Path = arguments.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        pure = build_pure_wheel(scratch / "pure")
        for arch in arguments.arch or sorted(PLATFORM_TAGS):
            print(arch_wheel(pure, arch, scratch, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
