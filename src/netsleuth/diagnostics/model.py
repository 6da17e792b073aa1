"""The one diagnostic model: what every diagnostic is, whoever runs it (the CLI, an agent session, `diagnose`,
a fleet task).

A diagnostic is a `DiagnosticSpec` registered once (netsleuth.diagnostics.registry): a name, a typed config
built by the same validation from CLI flags or from JSON (`ConfigInput`), and `open(config, context)` giving a
`DiagnosticSession` that yields typed records and a typed summary. Records are frozen dataclasses whose
`to_json()` carries `"type"` and `"v"` (the schema version of that record type, netsleuth.diagnostics.schema);
consumers read their attributes, never their JSON. Every session of one run shares one `KernelContext`, so
kallsyms is read once and every record's time comes from the same clock offset, carried in the summary.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError
from netsleuth.spec.configs import ConfigError

if TYPE_CHECKING:
    from netsleuth.kernel.context import KernelContext

__all__ = [
    "ConfigInput",
    "DiagnosticSession",
    "DiagnosticSpec",
    "Record",
    "RunOptions",
]


class Record(Protocol):
    """A typed record: a drop, a reset, a tcp event, a connection, a verdict, a summary."""

    def to_json(self) -> Mapping[str, Any]: ...


class DiagnosticSession(Protocol):
    """A diagnostic attached to the kernel. `start` loads and attaches (a fleet task's *prepare*); `poll`
    returns the records that arrived; `summary` is the closing record with exact totals and the clock."""

    @property
    def attach_kind(self) -> str:
        """How the programs attached (tp_btf, raw_tp, ...), once started."""
        ...

    def start(self) -> None: ...

    def poll(self, timeout_ms: int) -> Sequence[Record]: ...

    def drain(self) -> Sequence[Record]: ...

    def totals(self) -> EventTotals: ...

    def summary(self, interrupted: bool) -> Record: ...

    def program_fds(self) -> dict[str, int]: ...

    def notes(self) -> list[str]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RunOptions:
    """How a diagnostic runs, whatever it traces: the same keys for every one."""

    summary: bool = False  # count in the kernel, report groups at the end, emit no events
    sample: int = 1  # emit one event in N (totals stay exact)
    duration: float | None = None  # stop after this long (the CLI's --duration; sessions have their own)

    KEYS = ("summary", "sample", "duration")

    @classmethod
    def read(cls, values: ConfigInput) -> RunOptions:
        duration = values.number("duration")
        if duration is not None and duration <= 0:
            raise ConfigError("duration", "must be a positive number of seconds", flag="--duration")
        sample = values.integer("sample", default=1)
        if sample < 1:
            raise ConfigError("sample", "must be 1 (every event) or more", flag="--sample")
        return cls(summary=values.flag("summary"), sample=sample, duration=duration)

    def to_json(self) -> dict[str, Any]:
        return {"summary": self.summary, "sample": self.sample, "duration": self.duration}


class ConfigInput:
    """The raw values of one diagnostic's config, from CLI flags or from a JSON object, read with one set of
    checks so both give the same one-sentence errors (they name the CLI flag: `--dport`; as ConfigErrors they
    also carry the field, for a form).

    JSON may give a number where the CLI gives text (`"dport": 53`) and one value where a flag repeats
    (`"host": "198.18.0.1"`); a JSON key the diagnostic does not know is an error, naming the ones it does.
    """

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = values

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ConfigInput:
        return cls(vars(args))

    @classmethod
    def from_json(cls, data: object, diagnostic: str, known: Iterable[str]) -> ConfigInput:
        if not isinstance(data, Mapping):
            raise UsageError(f"the {diagnostic} config must be a JSON object")
        allowed = {"v", *known}
        for key in data:
            if key not in allowed:
                raise UsageError(f"{diagnostic} has no option {key!r}; it knows {', '.join(sorted(allowed))}")
        version = data.get("v", 1)
        if version != 1:
            raise UsageError(
                f"the {diagnostic} config is version {version!r}; this netsleuth reads version 1"
            )
        return cls(data)

    def replace(self, **changes: Any) -> ConfigInput:
        """The same values with some replaced (a diagnostic that reads one flag its own way first)."""
        return ConfigInput({**self._values, **changes})

    @staticmethod
    def flag_name(key: str) -> str:
        return "--" + key.replace("_", "-")

    @classmethod
    def _bad(cls, key: str, problem: str) -> ConfigError:
        """The field's error: the CLI reads `--flag problem`, a form marks the field `key`."""
        return ConfigError(key, problem, flag=cls.flag_name(key))

    def raw(self, key: str) -> Any:
        return self._values.get(key)

    def text(self, key: str) -> str | None:
        value = self._values.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise self._bad(key, f"must be text or a number (got {value!r})")
        return str(value)

    def texts(self, key: str) -> list[str]:
        value = self._values.get(key)
        if value is None:
            return []
        items = value if isinstance(value, list | tuple) else [value]
        texts = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, str | int):
                raise self._bad(key, f"must be text or a number (got {item!r})")
            texts.append(str(item))
        return texts

    def flag(self, key: str) -> bool:
        value = self._values.get(key, False)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self._bad(key, f"is true or false (got {value!r})")
        return value

    def integer(self, key: str, default: int) -> int:
        value = self._values.get(key)
        if value is None:
            return default
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, f"must be a whole number (got {value!r})")
        return value

    def number(self, key: str) -> float | None:
        value = self._values.get(key)
        if value is None:
            return None
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise self._bad(key, f"must be a number (got {value!r})") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._bad(key, f"must be a number (got {value!r})")
        return float(value)


ConfigT = TypeVar("ConfigT")


@dataclass(frozen=True)
class DiagnosticSpec(Generic[ConfigT]):
    """A registered diagnostic. `keys` are the JSON config keys it accepts (the CLI flags, without dashes);
    `read` builds the typed config from a `ConfigInput` (CLI or JSON alike); `open` attaches nothing until
    the session's `start`."""

    name: str
    help: str
    keys: tuple[str, ...]
    read: Callable[[ConfigInput], ConfigT]
    open: Callable[[ConfigT, KernelContext | None], DiagnosticSession]
    objects: tuple[str, ...]  # the BPF objects it loads (src/netsleuth/_generated/<name>.bpf.o)
    records: tuple[str, ...]  # the record types its sessions produce (netsleuth.diagnostics.schema)
    # The kernel features it cannot run without (netsleuth.bpf.features.probe_all names), so a host can say
    # which diagnostics it runs and, for the others, why not.
    needs: tuple[str, ...] = ()

    def config_from_json(self, data: object) -> ConfigT:
        return self.read(ConfigInput.from_json(data, self.name, self.keys))

    def config_from_args(self, args: argparse.Namespace) -> ConfigT:
        return self.read(ConfigInput.from_args(args))
