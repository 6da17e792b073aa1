"""Which diagnostics a host can run, and in words why not the others: each diagnostic's `needs` (declared in
its own spec), and what every agent session needs (netsleuth.agent.cpu_budget.SESSION_NEEDS), against the
features the host's agent probed (netsleuth.bpf.features.probe_all), worded by the probes' one place
(netsleuth.bpf.features.lacking).

The controller serves this with every host (GET /api/v1/hosts), so the hosts page says what a host is good
for instead of listing kernel flags, and names no diagnostic itself.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from netsleuth.agent.cpu_budget import SESSION_NEEDS
from netsleuth.bpf.features import lacking
from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic
from netsleuth.errors import UsageError

__all__ = ["SupportTable", "diagnostic_needs"]


@functools.cache
def diagnostic_needs() -> Mapping[str, tuple[str, ...]]:
    """What each registered diagnostic needs on an agent: its own needs, then the agent's for any session. It
    imports every diagnostic's module (about a second), once per process: call it off the event loop the
    first time."""
    needs: dict[str, tuple[str, ...]] = {}
    for name in diagnostic_names():
        try:
            needs[name] = (*get_diagnostic(name).needs, *SESSION_NEEDS)
        except (UsageError, ImportError):  # a plug-in whose module does not import here: unknown
            continue
    return needs


class SupportTable:
    """Which of its diagnostics a host can run, for hosts by the facts their agents probed: one answer per
    distinct set of facts and catalogue (a fleet's hosts share a handful of kernels, and every open hosts page
    asks for all of them every 3 s), so a listing of 1,000 hosts costs a dict lookup per host."""

    _MAX_ANSWERS = 1024  # distinct (facts, catalogue) pairs kept; beyond that the table starts afresh

    def __init__(self, needs: Mapping[str, tuple[str, ...]]) -> None:
        self._needs = needs
        self._answers: dict[tuple[Any, ...], list[dict[str, Any]]] = {}

    def of(self, features: Mapping[str, Any], diagnostics: Iterable[str]) -> list[dict[str, Any]]:
        """For each diagnostic the host offers: `{"diagnostic", "runs", "why"}`. `runs` is False with `why`
        the sentences of what is missing, True with `why` empty, or None when it cannot be told (a diagnostic
        this controller does not know, an agent that did not probe what it needs) with `why` saying so. The
        answer is shared between hosts: read it, do not change it."""
        # Only hashable facts take part (bools, texts, numbers); anything else is not a probe's answer.
        facts = tuple(
            sorted((k, v) for k, v in features.items() if isinstance(v, bool | str | int | float | None))
        )
        key = (facts, tuple(diagnostics))
        answer = self._answers.get(key)
        if answer is None:
            if len(self._answers) >= self._MAX_ANSWERS:
                self._answers.clear()
            answer = self._answers[key] = [
                {"diagnostic": name, "runs": runs, "why": why} for name, runs, why in self._answer(*key)
            ]
        return answer

    def _answer(
        self, facts: tuple[tuple[str, Any], ...], diagnostics: tuple[str, ...]
    ) -> list[tuple[str, bool | None, list[str]]]:
        found = dict(facts)
        answers: list[tuple[str, bool | None, list[str]]] = []
        for name in diagnostics:
            needs = self._needs.get(name)
            if needs is None:
                answers.append((name, None, [f"this controller does not know what {name} needs"]))
            elif isinstance(found.get("error"), str):
                answers.append((name, None, [f"the agent could not probe its kernel: {found['error']}"]))
            elif (causes := lacking(found, needs)) is None:
                missing = ", ".join(need for need in needs if need not in found)
                answers.append(
                    (name, None, [f"the agent does not report whether it has {missing} (an older agent)"])
                )
            else:
                answers.append((name, not causes, causes))
        return answers
