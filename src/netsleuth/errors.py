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
    "did_you_mean",
]

EXIT_USAGE = 2
EXIT_ENVIRONMENT = 1


def did_you_mean(name: str, known: list[str] | tuple[str, ...]) -> str:
    """The end of an "unknown NAME" sentence: the (at most three) closest known names by difflib's ratio,
    never a list of a hundred names. Compared without case, printed as known."""
    import difflib

    by_upper = {each.upper(): each for each in known}
    close = difflib.get_close_matches(name.upper(), list(by_upper), n=3, cutoff=0.0)
    if not close:
        return ""
    names = [repr(by_upper[each]) for each in close]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return f"; did you mean {listed}?"


class NetsleuthError(Exception):
    """Base of every error netsleuth raises on purpose."""

    exit_code = EXIT_ENVIRONMENT


class UsageError(NetsleuthError):
    """The user asked for something invalid: a bad filter, an unknown device, a bad file."""

    exit_code = EXIT_USAGE


class EnvironmentProblem(NetsleuthError):
    """The machine lacks something netsleuth needs: privileges, BTF, libbpf, a kernel feature."""

    exit_code = EXIT_ENVIRONMENT
