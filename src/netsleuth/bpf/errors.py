"""Typed errors of the loader layer, translated from libbpf's errno returns (`raise ... from`)."""

from __future__ import annotations

import ctypes
import errno
import os

from netsleuth.errors import EnvironmentProblem

__all__ = ["BpfError", "MissingFeature", "VerifierError", "last_errno_error"]


class BpfError(EnvironmentProblem):
    """A libbpf call failed; `errno` is the kernel's answer."""

    def __init__(self, message: str, error_number: int = 0, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.errno = error_number
        self.details = details or []


class VerifierError(BpfError):
    """The kernel refused to load a program; `log` is the verifier's explanation."""

    def __init__(self, message: str, error_number: int, log: str, details: list[str] | None = None) -> None:
        super().__init__(message, error_number, details)
        self.log = log


class MissingFeature(BpfError):
    """The running kernel lacks a feature a diagnostic needs; names it and the first kernel that has it.

    A BpfError, so code that goes on without one diagnostic when its programs cannot load (diagnose without
    the tcp programs, a variant loop) treats "this kernel is too old" like any other refusal to load.
    """

    def __init__(self, feature: str, minimum_kernel: str, hint: str = "") -> None:
        text = f"this kernel lacks {feature} (needs Linux {minimum_kernel} or newer)"
        super().__init__(f"{text}; {hint}" if hint else text)
        self.feature = feature
        self.minimum_kernel = minimum_kernel
        self.hint = hint


def last_errno_error(what: str, details: list[str] | None = None) -> BpfError:
    """A BpfError for the errno the last libbpf call left, with advice for the common permission case."""
    number = ctypes.get_errno()
    reason = os.strerror(number) if number else "unknown error"
    if number in (errno.EPERM, errno.EACCES):
        message = f"{what}: {reason}; run netsleuth as root (or with CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN)"
    else:
        message = f"{what}: {reason}"
    return BpfError(message, number, details)
