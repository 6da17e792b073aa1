"""Typed handles on a BPF object's maps, programs and `.rodata` variables (what `bpftool gen skeleton` and
bpf2go generate): netsleuth.bpf.abigen writes, for each object, a `<Name>Maps`, `<Name>Programs` and
`<Name>Rodata` class whose attributes are the object's own names, read from its BTF and ELF sections. Python
code names a map as `maps.netns_filter`, never as the text "netns_filter": a map, program or variable renamed
in C is then gone from the regenerated class, and mypy (`make typecheck`, part of `make test`) fails every
line that still uses it instead of the run failing, or worse, a filter silently staying open.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, overload

from netsleuth.bpf.abi import Program
from netsleuth.bpf.errors import BpfError

if TYPE_CHECKING:
    from netsleuth.bpf.maps import BpfMap
    from netsleuth.bpf.object import BpfObject

__all__ = ["MapAttr", "ObjectMaps", "Skeleton", "variant_programs"]

_OUT_OF_STEP = "the object and the Python code are out of step (run `make bpf`)"

M = TypeVar("M", bound="ObjectMaps")


class MapAttr:
    """One map of a generated `<Name>Maps` class. On the class it is the map's name and declared size (what
    is set before load); on an instance bound to a loaded object it is that object's BpfMap."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.name = ""
        self.owner: type[ObjectMaps] | None = None

    def __set_name__(self, owner: type[ObjectMaps], name: str) -> None:
        self.name = name
        self.owner = owner

    @overload
    def __get__(self, instance: None, owner: type[ObjectMaps]) -> MapAttr: ...

    @overload
    def __get__(self, instance: ObjectMaps, owner: type[ObjectMaps]) -> BpfMap: ...

    def __get__(self, instance: ObjectMaps | None, owner: type[ObjectMaps]) -> MapAttr | BpfMap:
        if instance is None:
            return self
        return instance.find(self)

    def __repr__(self) -> str:
        return f"MapAttr({self.name!r})"


class ObjectMaps:
    """Base of a generated `<Name>Maps`: the maps of one loaded object, each looked up once (a counter read
    often must not pay a lookup each time)."""

    object_name: ClassVar[str]

    def __init__(self, bpf_object: BpfObject) -> None:
        self._object = bpf_object
        self._found: dict[str, BpfMap] = {}

    def find(self, attr: MapAttr) -> BpfMap:
        if attr.owner is not None and not isinstance(self, attr.owner):
            raise BpfError(
                f"map {attr.name} is one of {attr.owner.object_name}.bpf.o's, not {self.object_name}'s"
            )
        found = self._found.get(attr.name)
        if found is None:
            found = self._found[attr.name] = self._object.map(attr.name)
        return found

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(name for name, value in vars(cls).items() if isinstance(value, MapAttr))


class Skeleton(Generic[M]):
    """Base of a generated `<Name>Object`: one opened object and its typed maps (`maps.drop_groups`); its
    programs and .rodata are the class attributes `programs` and `rodata`."""

    object_name: ClassVar[str]
    Maps: type[M]
    programs: ClassVar[type]
    rodata: ClassVar[type]

    def __init__(self, bpf_object: BpfObject) -> None:
        self.bpf_object = bpf_object
        self.maps: M = self.Maps(bpf_object)

    @classmethod
    def program_names(cls) -> frozenset[str]:
        return frozenset(value.name for value in vars(cls.programs).values() if isinstance(value, Program))


def variant_programs(
    skeleton: type[Skeleton[Any]], bases: Sequence[str], suffixes: Sequence[str]
) -> tuple[str, ...]:
    """`bases`, checked: every base name with every variant suffix must be a program of the object. Called at
    import (a module's constants), so a program renamed in C fails every test that imports its diagnostic."""
    names = skeleton.program_names()
    missing = [base + suffix for base in bases for suffix in suffixes if base + suffix not in names]
    if missing:
        raise BpfError(f"{skeleton.object_name}.bpf.o has no program {', '.join(missing)}: {_OUT_OF_STEP}")
    return tuple(bases)
