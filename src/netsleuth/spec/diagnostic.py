"""`DiagnosticSpec`: the one plug-in surface. A diagnostic declares, in its own package, its typed config, its
typed records, how it is kept inside a scope, what it needs from the kernel, how its records read as text,
the verdict rules it gives `diagnose` and the collectors it gives the exporter; the CLI subcommand and flags,
JSON/task validation, the web form, the controller's OpenAPI, the agent's scope narrowing and last-line
filter, the records' JSON, JSON Schema and docs/records.md are all derived from it (netsleuth.spec.*).

It is registered by one line (netsleuth.diagnostics.registry, or a `netsleuth.diagnostics` entry point
for a diagnostic that lives outside this package); nothing outside its package names it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import msgspec

from netsleuth.spec.configs import Config, Speaker, cli_fields, read_config
from netsleuth.spec.records import Record
from netsleuth.spec.scope import ScopeTraits

if TYPE_CHECKING:
    from netsleuth.diagnostics.model import DiagnosticSession
    from netsleuth.kernel.context import KernelContext
    from netsleuth.spec.collectors import ExporterCollector
    from netsleuth.spec.diagnose import DiagnoseWatch

__all__ = ["CliRun", "DiagnosticSpec"]

C = TypeVar("C", bound=Config)


class CliRun(msgspec.Struct, frozen=True):
    """What a diagnostic needs on the command line beyond its config: flags that only make sense in a
    terminal (`--pcap FILE`), and how it runs there when that is more than `run_session` with its view."""

    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    run: Callable[[Any, argparse.Namespace], int] | None = None  # (config, args) -> exit status


class DiagnosticSpec(msgspec.Struct, Generic[C], frozen=True):
    """A registered diagnostic.

    `name` is its registry name; a dotted name (`tcp.life`) is a CLI subcommand under its first part
    (`netsleuth tcp life`). `config` is its typed config; `records` the record types its sessions yield
    (its summary included); `open(config, context)` attaches nothing until the session's `start`.
    `needs` names the kernel features it cannot run without (netsleuth.bpf.features), so a host can say
    which diagnostics it runs; `view(config)` is how its records read on a terminal (None: no CLI command, or
    one that `cli.run` runs its own way);
    `diagnose` its part of `netsleuth diagnose` (netsleuth.spec.diagnose), if it has one;
    `collectors` what it offers the agent's exporter (netsleuth.spec.collectors), if anything.
    """

    name: str
    help: str
    config: type[C]
    records: tuple[type[Record], ...]
    open: Callable[[C, KernelContext | None], DiagnosticSession]
    objects: tuple[str, ...] = ()
    scope: ScopeTraits = msgspec.field(default_factory=ScopeTraits)
    needs: tuple[str, ...] = ()
    view: Callable[[C], Any] | None = None
    cli: CliRun = msgspec.field(default_factory=CliRun)
    description: str = ""
    diagnose: DiagnoseWatch | None = None
    collectors: tuple[ExporterCollector, ...] = ()

    @property
    def command(self) -> tuple[str, ...]:
        """The CLI words: ("drops",), ("tcp", "life")."""
        return tuple(self.name.split("."))

    def config_from_json(self, data: object, speaker: Speaker = Speaker.JSON) -> C:
        """The config an agent session, a fleet task or the controller's API gave, checked."""
        if not isinstance(data, Mapping):
            return read_config(self.config, data, speaker, self.name)  # type: ignore[arg-type]
        return read_config(self.config, data, speaker, self.name)

    def config_from_args(self, args: argparse.Namespace) -> C:
        from netsleuth.spec.flags import config_from_args

        return config_from_args(self.config, args, self.name)

    @property
    def keys(self) -> tuple[str, ...]:
        """The JSON config keys it accepts (its config's fields)."""
        return tuple(field.encode_name for field in cli_fields(self.config))
