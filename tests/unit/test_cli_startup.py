"""The CLI's start: only the chosen command's module is loaded, and garbage collection is held off only for
commands that resume it once attached (netsleuth.startup_gc, commands/_runloop.run_session)."""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from netsleuth import cli, startup_gc
from netsleuth.commands._runloop import run_session
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.spec.common import RunConfig

_COMMANDS = Path(cli.__file__).parent / "commands"


@pytest.fixture(autouse=True)
def _collection_on() -> Iterator[None]:
    assert gc.isenabled()
    yield
    startup_gc.resume_collection()
    gc.enable()


@pytest.mark.parametrize("name", sorted(cli._COMMAND_MODULES))
def test_no_hand_written_command_runs_a_session(name: str) -> None:
    # Only the diagnostics' derived commands attach (cli._attaching): a hand-written one ending in
    # run_session would run with collection off for good.
    source = (_COMMANDS / f"{name}.py").read_text()
    assert "run_session(" not in source and not cli._attaching(name)


def test_bad_input_of_an_attaching_command_leaves_collection_on(capsys: pytest.CaptureFixture[str]) -> None:
    # A value the command refuses (returns 2) and an option argparse refuses (exits 2) alike.
    assert cli.main(["drops", "--port", "70000x"]) == 2
    assert gc.isenabled()
    with pytest.raises(SystemExit) as stopped:
        cli.main(["drops", "--no-such-option"])
    assert stopped.value.code == 2
    assert gc.isenabled()
    assert capsys.readouterr().err.count("\n") == 2


def test_other_commands_run_with_collection_on(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def run(_args: argparse.Namespace) -> int:
        seen.append(gc.isenabled())
        return 0

    original = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda argv: _with_run(original(argv), run))
    assert cli.main(["doctor"]) == 0
    assert seen == [True]


def test_attaching_command_starts_paused_and_run_session_resumes_once_attached(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    states: dict[str, bool] = {}

    class Session:
        attach_kind = "tp_btf"

        def start(self) -> None:
            states["start"] = gc.isenabled()

        def poll(self, _timeout_ms: int) -> list[Any]:
            states["poll"] = gc.isenabled()
            return []

        def drain(self) -> list[Any]:
            return []

        def totals(self) -> EventTotals:
            return EventTotals()

        def summary(self, _interrupted: bool) -> None:
            return None

        def notes(self) -> list[str]:
            return []

        def close(self) -> None:
            pass

    class View:
        noun = "drops"

        def lines(self, _records: Any) -> str:
            return ""

        def finish(self, *_args: Any) -> None:
            pass

        def loss_line(self, _totals: EventTotals) -> str:
            return ""

    ready = tmp_path / "ready"

    def run(_args: argparse.Namespace) -> int:
        states["before"] = gc.isenabled()
        return run_session(
            Session(),  # type: ignore[arg-type]
            RunConfig(duration=0.01),
            View(),
            json_lines=False,
            ready_file=str(ready),
        )

    original = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda argv: _with_run(original(argv), run))
    assert cli.main(["drops", "--summary"]) == 0
    assert states == {"before": False, "start": False, "poll": True}
    assert ready.exists()
    assert gc.isenabled()


def _python(code: str, *args: str) -> str:
    """What a fresh interpreter running `code` prints."""
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=True
    ).stdout


def _with_run(parser: argparse.ArgumentParser, run: Any) -> argparse.ArgumentParser:
    for action in parser._subparsers._group_actions:  # type: ignore[union-attr]
        for sub in action.choices.values():  # type: ignore[union-attr]
            sub.set_defaults(_run=run)
    return parser


@pytest.mark.parametrize("argv", [["--help"], ["-h", "drops"]])
def test_top_level_help_still_describes_every_command(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "netsleuth", *argv], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    described = {
        line.split()[0] for line in result.stdout.splitlines() if line.startswith("    ") and line[4] != " "
    }
    assert described == {*cli._COMMAND_MODULES, *cli._diagnostic_words(with_plugins=True)}


@pytest.mark.parametrize(
    ("command", "modules"),
    [
        ("doctor", "['netsleuth.commands.doctor']"),
        # A diagnostic's command is derived from its spec: no command module, and no other diagnostic loaded.
        ("tcp", "[]"),
    ],
)
def test_a_known_command_loads_and_builds_only_itself(command: str, modules: str) -> None:
    code = (
        "import sys\n"
        "from netsleuth import cli\n"
        f"parser = cli.build_parser(['{command}', '--summary'])\n"
        "subparsers = parser._subparsers._group_actions[0]\n"
        "print(sorted(subparsers.choices))\n"
        "loaded = [m for m in sys.modules if m.startswith('netsleuth.commands.')]\n"
        "print(sorted(m for m in loaded if m.rpartition('.')[2] in cli._COMMAND_MODULES))\n"
        "names = [name for name in ('route', 'snoop', 'dns')]\n"
        "others = tuple(f'netsleuth.diagnostics.{name}' for name in names)\n"
        "print(sorted(m for m in sys.modules if m.startswith(others)))\n"
    )
    assert _python(code, command).splitlines() == [f"['{command}']", modules, "[]"]


@pytest.mark.parametrize(("name", "collecting"), [("doctor", True), ("drops", False)])
def test_launcher_pauses_before_the_cli_and_the_cli_decides(
    monkeypatch: pytest.MonkeyPatch, name: str, collecting: bool
) -> None:
    from netsleuth.__main__ import main as launcher

    seen: list[bool] = []

    def run(_args: argparse.Namespace) -> int:
        seen.append(gc.isenabled())
        return 0

    original = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda argv: _with_run(original(argv), run))
    monkeypatch.setattr(sys, "argv", ["netsleuth", name])
    assert launcher() == 0
    assert seen == [collecting]
    assert gc.isenabled()


def test_a_built_in_command_reads_no_installed_distribution() -> None:
    # Plug-ins are found through importlib.metadata's entry points, which reads every installed distribution
    # (and imports email, zipfile, csv...): a run of a built-in diagnostic never needs them.
    code = (
        "import sys\n"
        "from netsleuth import cli\n"
        "cli.build_parser(['drops', '--summary']).parse_args(['drops', '--summary'])\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    assert _python(code).strip() == "False"


# Modules a `drops --summary` start has no use for before it attaches (each costs milliseconds of it).
_NOT_BEFORE_ATTACH = (
    "difflib",
    "importlib.metadata",
    "rich",
    "nats",
    "fastapi",
    "prometheus_client",
    "asyncio",
    "shutil",
    "subprocess",
    "netsleuth.firewall",
    "netsleuth.kernel.kallsyms",
    "netsleuth.kernel.context",
    "netsleuth.agent",
    "netsleuth.spec.schemas",
    "netsleuth.diagnostics.model",
    "netsleuth.diagnostics.drops.rules",
    "netsleuth.diagnostics.drops.enrich",
    "netsleuth.diagnostics.drops.decode",
)


def test_the_drops_summary_start_defines_no_dataclass_and_skips_what_it_does_not_need() -> None:
    # Up to the session's start (faked here: it needs root): a dataclass costs about a millisecond to define
    # (its methods are generated and exec()ed; a msgspec Struct is some 50 times faster), msgspec.inspect's
    # view of the config (spec.configs.config_fields) 8 ms, and each module in the list above more than that.
    # bpf/ is left out of the dataclass check (not in this test's hands); the real start imports it too.
    code = (
        "import json, sys\n"
        "from netsleuth import cli\n"
        "from netsleuth.commands import _runloop\n"
        "from netsleuth.diagnostics.drops import session\n"
        "from netsleuth.spec import configs\n"
        "seen = {}\n"
        "session.open_drops = lambda config, **options: object()\n"
        "def run_session(*args, **options):\n"
        "    seen['modules'] = sorted(sys.modules)\n"
        "    return 0\n"
        "_runloop.run_session = run_session\n"
        "assert cli.main(['drops', '--summary', '--ready-file', '/nonexistent/ready']) == 0\n"
        "dataclasses = sorted({\n"
        "    name for name, module in sys.modules.items()\n"
        "    if name.startswith('netsleuth.') and not name.startswith('netsleuth.bpf')\n"
        "    for value in vars(module).values()\n"
        "    if isinstance(value, type) and '__dataclass_fields__' in vars(value)\n"
        "    and value.__module__ == name\n"
        "})\n"
        "print(json.dumps({'modules': seen['modules'], 'dataclasses': dataclasses,\n"
        "                  'inspected': sorted(kind.__name__ for kind in configs._FIELDS)}))\n"
    )
    report = json.loads(_python(code))
    loaded = set(report["modules"])
    assert "netsleuth.diagnostics.drops.session" in loaded  # the path was taken
    assert report["dataclasses"] == []
    assert report["inspected"] == []
    assert [name for name in _NOT_BEFORE_ATTACH if name in loaded] == []
