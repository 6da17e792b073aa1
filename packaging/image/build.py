"""Build netsleuth's OCI image offline from Debian packages: no image registry, no compiler, no headers.

    .venv/bin/python packaging/image/build.py [--cache DIR] [--rebuild-base]

prints the image as podman names it (`oci:<layout>:<tag>`). Two layers, each cached by what it is made of:

1. the Debian root filesystem: mmdebstrap (variant essential, merged /usr without the usrmerge package and
   its perl) from the machine's own Debian sources, holding Python 3, libbpf1 and what names firewall rules
   (iptables, nftables). No docs but the copyright files, no man pages, no locales. Its key is the package
   list, the options, the sources and the ISO week, so a cached base picks up Debian's security updates
   within a week.
2. netsleuth: the wheel built for this machine's architecture (packaging/build_wheels.py) with the fleet,
   controller and cri extras, installed by pip into /usr/local/lib/python3.X/dist-packages (on Debian's
   sys.path) and byte-compiled with the image's own paths; /usr/local/bin/netsleuth runs it. Its key is the
   content of everything that goes into the wheel.

umoci stacks the two layers into an OCI image layout under the cache folder (one tag per key pair; older
tags are removed and their blobs collected). The entrypoint is `netsleuth`, the default command `agent`.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CACHE = Path("/var/cache/netsleuth-image")
SUITE = "bookworm"
# python3: the interpreter and its standard library (ctypes loads libbpf); libbpf1: loads the programs;
# iptables, nftables: the rule behind a NETFILTER_DROP (iptables-save, nft); ca-certificates: tls:// NATS.
PACKAGES = ("python3", "libbpf1", "iptables", "nftables", "ca-certificates")
MMDEBSTRAP_OPTIONS = (
    "--variant=essential",
    # merged /usr by the hook's symlinks and usr-is-merged, instead of the usrmerge package (and perl).
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=force-unsafe-io",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    # apt's lists and caches are not part of the image.
    "--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/* $1/var/log/*",
)
SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
EXTRAS = "fleet,controller,cri"
# What goes into the wheel and the app layer: a change to any of it makes a new layer.
APP_INPUTS = (
    "src", "pyproject.toml", "README.md", "LICENSE", "LICENSES", "MANIFEST.in", "Makefile", "bpf",
    "packaging/build_wheels.py", "packaging/image/build.py",
)  # fmt: skip
# Build-time files some wheels carry (cffi's and Cython's C headers and sources): useless without a compiler.
BUILD_ONLY_SUFFIXES = (".h", ".c", ".pyx", ".pxd", ".pxi")
ENTRYPOINT = """#!/usr/bin/python3
import sys

from netsleuth.__main__ import main

sys.exit(main())
"""
KEEP_TAGS = 2


def _run(*argv: str | Path, **kwargs: object) -> str:
    result = subprocess.run([str(arg) for arg in argv], capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if result.returncode != 0:
        sys.exit(f"{' '.join(map(str, argv))} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return str(result.stdout)


def _sources() -> Path:
    """The machine's own Debian sources (deb822), which mmdebstrap reads as its mirror list."""
    if SOURCES.exists():
        return SOURCES
    sys.exit(f"{SOURCES} is missing: the image is built from this machine's Debian sources")


def base_key() -> str:
    year, week, _ = datetime.date.today().isocalendar()
    digest = hashlib.sha256()
    for part in (SUITE, *PACKAGES, *MMDEBSTRAP_OPTIONS, _sources().read_text(), f"{year}-W{week}"):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def app_key() -> str:
    digest = hashlib.sha256(EXTRAS.encode())
    for top in APP_INPUTS:
        root = REPO / top
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _partial(out: Path) -> Path:
    """Where `out` is written until it is complete (a .tar name: mmdebstrap writes a tarball by its name)."""
    return out.with_name(f"{out.stem}.partial.tar")


def build_base(out: Path) -> None:
    partial = _partial(out)
    _run(
        "mmdebstrap",
        "--quiet",
        *MMDEBSTRAP_OPTIONS,
        f"--include={','.join(PACKAGES)}",
        SUITE,
        partial,
        _sources(),
    )
    partial.rename(out)


def python_version(base_tar: Path) -> str:
    """python3.X of the base (the app layer must be built for the same)."""
    names = _run("tar", "-tf", base_tar, "--wildcards", "./usr/bin/python3.*").split()
    versions = sorted({Path(name).name for name in names if Path(name).name.count(".") == 1})
    if not versions:
        sys.exit(f"no python3.X in {base_tar}")
    return versions[-1]


def build_app(out: Path, python: str) -> None:
    if f"python{sys.version_info.major}.{sys.version_info.minor}" != python:
        sys.exit(f"the image has {python}, this build runs on {sys.version}: build with the image's Python")
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        arch = {"x86_64": "x86", "aarch64": "arm64"}[os.uname().machine]
        wheel = Path(
            _run(
                sys.executable, REPO / "packaging/build_wheels.py", "--arch", arch, "--out", scratch / "dist"
            )
            .strip()
            .splitlines()[-1]
        )
        root = scratch / "root"
        site = root / "usr/local/lib" / python / "dist-packages"
        _run(
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-compile",
            "--prefer-binary",
            "--target",
            site,
            f"{wheel}[{EXTRAS}]",
        )
        shutil.rmtree(site / "bin", ignore_errors=True)  # scripts with this venv's interpreter in them
        for path in site.rglob("*"):
            if path.suffix in BUILD_ONLY_SUFFIXES and path.is_file():
                path.unlink()
        # Compiled with the image's paths (/usr/local/...), as the image will import them: a read-only root
        # could not write them at run time.
        _run(sys.executable, "-m", "compileall", "-q", "-j", "0", "-s", root, "-p", "/", site)
        entrypoint = root / "usr/local/bin/netsleuth"
        entrypoint.parent.mkdir(parents=True)
        entrypoint.write_text(ENTRYPOINT)
        entrypoint.chmod(0o755)
        partial = _partial(out)
        _run(
            "tar", "--numeric-owner", "--owner=0", "--group=0", "--sort=name", "-C", root, "-cf", partial, "."
        )
        partial.rename(out)


def assemble(layout: Path, tag: str, base_tar: Path, app_tar: Path) -> None:
    if not (layout / "index.json").exists():
        _run("umoci", "init", "--layout", layout)
    scratch_tag = f"{tag}-partial"
    _run("umoci", "new", "--image", f"{layout}:{scratch_tag}")
    _run(
        "umoci",
        "config",
        "--image",
        f"{layout}:{scratch_tag}",
        "--architecture",
        {"x86_64": "amd64", "aarch64": "arm64"}[os.uname().machine],
        "--os",
        "linux",
    )
    for layer, comment in ((base_tar, "Debian root filesystem (mmdebstrap)"), (app_tar, "netsleuth")):
        _run(
            "umoci",
            "raw",
            "add-layer",
            "--history.comment",
            comment,
            "--image",
            f"{layout}:{scratch_tag}",
            layer,
        )
    _run(
        "umoci",
        "config",
        "--image",
        f"{layout}:{scratch_tag}",
        "--tag",
        tag,
        "--config.entrypoint",
        "/usr/local/bin/netsleuth",
        "--config.cmd",
        "agent",
        "--config.env",
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--config.env",
        "PYTHONDONTWRITEBYTECODE=1",
        "--config.label",
        "org.opencontainers.image.title=netsleuth",
        "--config.label",
        "org.opencontainers.image.licenses=Apache-2.0 AND GPL-2.0-only",
    )
    _run("umoci", "rm", "--image", f"{layout}:{scratch_tag}")


def prune(layout: Path, cache: Path, keep: set[str]) -> None:
    """Remove all but the newest KEEP_TAGS tags and the layer tarballs no kept tag uses."""
    tags = _run("umoci", "ls", "--layout", layout).split()
    stamps = {
        tag: (cache / f"tag-{tag}").stat().st_mtime if (cache / f"tag-{tag}").exists() else 0 for tag in tags
    }
    for tag in sorted(tags, key=lambda tag: stamps[tag], reverse=True)[KEEP_TAGS:]:
        _run("umoci", "rm", "--image", f"{layout}:{tag}")
        (cache / f"tag-{tag}").unlink(missing_ok=True)
    _run("umoci", "gc", "--layout", layout)
    kept = {part for tag in _run("umoci", "ls", "--layout", layout).split() for part in tag.split("-")} | keep
    for tarball in [*cache.glob("base-*.tar"), *cache.glob("app-*.tar")]:
        if tarball.stem.split("-", 1)[1] not in kept and ".partial" not in tarball.name:
            tarball.unlink()


def build(cache: Path, rebuild_base: bool = False) -> str:
    """The image (building what its cache lacks) as `oci:<layout>:<tag>`; one build at a time per cache."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(cache, rebuild_base)


def _build_locked(cache: Path, rebuild_base: bool) -> str:
    base, app = base_key(), app_key()
    base_tar, app_tar = cache / f"base-{base}.tar", cache / f"app-{app}.tar"
    if rebuild_base:
        base_tar.unlink(missing_ok=True)
    if not base_tar.exists():
        build_base(base_tar)
    if not app_tar.exists():
        build_app(app_tar, python_version(base_tar))
    layout, tag = cache / "oci", f"{base}-{app}"
    if tag not in (
        _run("umoci", "ls", "--layout", layout).split() if (layout / "index.json").exists() else []
    ):
        assemble(layout, tag, base_tar, app_tar)
    (cache / f"tag-{tag}").touch()
    prune(layout, cache, {base, app})
    return f"oci:{layout}:{tag}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"default {DEFAULT_CACHE}")
    parser.add_argument("--rebuild-base", action="store_true", help="rebuild the Debian layer even if cached")
    arguments = parser.parse_args()
    print(build(arguments.cache, arguments.rebuild_base))
    return 0


if __name__ == "__main__":
    sys.exit(main())
