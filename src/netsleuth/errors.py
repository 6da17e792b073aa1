"""The error hierarchy every layer raises and the CLI turns into one sentence and an exit code.

A user's mistake (a bad filter, an unknown device) is a `UsageError` and exits 2; the environment lacking
something (root, BTF, libbpf, a kernel feature) is an `EnvironmentProblem` and exits 1. Both carry a message
written for the person at the terminal, never a traceback.
"""

from __future__ import annotations

__all__ = [
    "EXIT_ENVIRONMENT",
    "EXIT_USAGE",
    "EnvironmentProblem",
    "NetsleuthError",
    "UsageError",
]

EXIT_USAGE = 2
EXIT_ENVIRONMENT = 1


class NetsleuthError(Exception):
    """Base of every error netsleuth raises on purpose."""

    exit_code = EXIT_ENVIRONMENT


class UsageError(NetsleuthError):
    """The user asked for something invalid: a bad filter, an unknown device, a bad file."""

    exit_code = EXIT_USAGE


class EnvironmentProblem(NetsleuthError):
    """The machine lacks something netsleuth needs: privileges, BTF, libbpf, a kernel feature."""

    exit_code = EXIT_ENVIRONMENT
