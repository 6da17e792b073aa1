"""What the agent's TOML config file is read with: one table at a time through typed getters with ranges, and
the secrets it names from owner-only files.

Its own module so that the parts of the file that live elsewhere (the `[fleet]` section, fleet/link_config.py)
read their table the same way without importing the agent's config, which imports them.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from netsleuth.errors import UsageError

__all__ = ["ConfigTable", "read_secret"]


class ConfigTable:
    """One TOML table being validated: typed getters with ranges, then `finish()` rejects leftovers."""

    def __init__(self, raw: Any, path: str, source: str) -> None:
        self.path = path
        self.source = source
        if not isinstance(raw, dict):
            raise self.error(path, "must be a table")
        self._raw: dict[str, Any] = dict(raw)

    def error(self, key: str, problem: str, value: object = None) -> UsageError:
        got = f" (got {value!r})" if value is not None else ""
        return UsageError(f"config {self.source}: {key} {problem}{got}")

    def _key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def names(self) -> list[str]:
        """The keys not read yet (all of them before the first getter)."""
        return list(self._raw)

    def table(self, name: str) -> ConfigTable:
        return ConfigTable(self._raw.pop(name, {}), self._key(name), self.source)

    def boolean(self, name: str, default: bool) -> bool:
        value = self._raw.pop(name, default)
        if not isinstance(value, bool):
            raise self.error(self._key(name), "must be true or false", value)
        return value

    def integer(self, name: str, default: int, minimum: int, maximum: int, unit: str = "") -> int:
        value = self._raw.pop(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
            suffix = f" {unit}" if unit else ""
            raise self.error(
                self._key(name), f"must be an integer from {minimum} to {maximum}{suffix}", value
            )
        return value

    def number(self, name: str, default: float, minimum: float, maximum: float, unit: str) -> float:
        value = self._raw.pop(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not minimum <= value <= maximum:
            raise self.error(
                self._key(name), f"must be a number from {minimum:g} to {maximum:g} {unit}", value
            )
        return float(value)

    def string(self, name: str, default: str) -> str:
        value = self._raw.pop(name, default)
        if not isinstance(value, str):
            raise self.error(self._key(name), "must be a string", value)
        return value

    def finish(self) -> None:
        for name in self._raw:
            raise self.error(self._key(name), "is not a known setting (see docs/agent.md)")


def read_secret(path: Path, key: str, min_length: int = 1) -> str:
    """A secret from a file only its owner can read (the session token, the fleet's NATS password)."""
    try:
        status = path.stat()
        secret = path.read_text().strip()
    except OSError as error:
        raise UsageError(f"{key} {path}: {error.strerror}") from None
    # The secret is the only thing between the network and loading programs into this kernel.
    if status.st_mode & (stat.S_IROTH | stat.S_IWOTH):
        raise UsageError(f"{key} {path} is readable by other users: chmod 600 it")
    if not secret:
        raise UsageError(f"{key} {path} is empty")
    if len(secret) < min_length:
        raise UsageError(f"{key} {path} must hold a secret of at least {min_length} characters")
    return secret
