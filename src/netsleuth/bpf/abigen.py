"""Generate the Python side of the kernel ABI from the compiled BPF objects' BTF (the idea of cilium/ebpf's
bpf2go): ctypes mirrors of every struct userspace shares with a program, its enums and limits, its maps' sizes
and its program -> tracepoint table, as committed modules under src/netsleuth/_generated/.

    python -m netsleuth.bpf.abigen           # write the modules (`make bpf` runs this after clang)
    python -m netsleuth.bpf.abigen --check   # exit 1 naming each stale module (`make check-bpf`)

It lives in the package, not in tools/, because it reads BTF with the same code (netsleuth.bpf.btf_layout over
libbpf) as the loader's mirror check (netsleuth.bpf.abi.check_mirror): what is generated and what is verified
at load are one reading of one BTF. No C is parsed: limits and flags are enum values in bpf/*.h so that they
reach the BTF, and the specs below only give Python names to what the BTF holds.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from netsleuth.bpf import _libbpf, btf_layout
from netsleuth.bpf.btf import Btf
from netsleuth.errors import EnvironmentProblem

__all__ = ["MODULES", "EnumSpec", "ModuleSpec", "generate", "main"]

GENERATED = Path(__file__).resolve().parent.parent / "_generated"
_LINE = 110  # ruff's line-length: the modules are written as `ruff format` would leave them


@dataclass(frozen=True)
class EnumSpec:
    """How one C enum appears in Python: a KernelEnum class (or IntFlag), or module constants (class None).

    `counts` are sentinel members (NS_STAT_COUNT...) that are no value of the enum: they become a non-member
    attribute of the class and a module constant of the given name."""

    c_name: str
    python_name: str | None = None
    prefix: str = ""
    counts: Mapping[str, str] = field(default_factory=dict)
    flag: bool = False


@dataclass(frozen=True)
class ModuleSpec:
    name: str  # module under netsleuth._generated
    objects: tuple[str, ...]  # the objects whose BTF it is read from (several: must agree)
    doc: str
    structs: Mapping[str, str] = field(default_factory=dict)  # C struct -> Python class
    enums: tuple[EnumSpec, ...] = ()
    aliases: Mapping[str, str] = field(default_factory=dict)  # older Python name -> generated name
    shared: tuple[str, ...] = ()  # names of the shared module this one re-exports
    tables: bool = True  # maps, programs and .rodata of its one object, as typed handles
    filter: str = ""  # the shared filter (FILTER_MAPS) the object carries: "netns" or "packet"


# What netsleuth.diagnostics.filter_maps fills in an object that filters (bpf/filter_maps.bpf.h): its maps,
# and the fields of its config struct it writes whatever the run asks (a field it writes only when a filter is
# set is refused then: fill_filter_config fails closed).
FILTER_MAPS: Mapping[str, tuple[str, ...]] = {
    "netns": ("netns_filter",),
    "packet": ("netns_filter", "host_filter", "src_filter", "dst_filter", "owner_inodes"),
}
FILTER_FIELDS: Mapping[str, tuple[str, ...]] = {
    "netns": ("netns", "filter_netns"),
    "packet": ("netns", "filter_netns", "filter_host", "filter_src", "filter_dst", "filter_owner", "port"),
}

_STAT = EnumSpec("ns_stat", "EventStat", "NS_STAT_", {"NS_STAT_COUNT": "STAT_COUNT"})

MODULES: tuple[ModuleSpec, ...] = (
    ModuleSpec(
        "shared_abi",
        ("drops", "tcp"),
        "What every netsleuth object shares (bpf/packet.h, bpf/emit.h): packet tuples, filter keys, stats.",
        {"packet_tuple": "PacketTupleC", "lpm_addr_key": "LpmAddrKey"},
        (_STAT, EnumSpec("ns_emit_limits")),
        tables=False,
    ),
    ModuleSpec(
        "drops_abi",
        ("drops",),
        "The drops object (bpf/drops.h, bpf/drops.bpf.c).",
        {
            "drops_config": "DropsConfigC",
            "drop_event": "DropEvent",
            "drop_group_key": "DropGroupKey",
            "drop_group": "DropGroupValue",
            "drop_run": "DropRunC",
        },
        (EnumSpec("drops_limits"),),
        {"DropStat": "EventStat"},
        ("STAT_COUNT",),
        filter="packet",
    ),
    ModuleSpec(
        "tcp_abi",
        ("tcp",),
        "The tcp object (bpf/tcp.h, bpf/tcp.bpf.c).",
        {
            "tcp_range": "TcpRangeC",
            "tcp_config": "TcpConfigC",
            "tcp_event": "TcpEventC",
            "tcp_group_key": "TcpGroupKeyC",
            "tcp_group": "TcpGroupC",
            "tcp_listener_slots": "TcpListenerSlotsC",
            "tcp_sock_info": "TcpSockInfoC",
        },
        (
            EnumSpec("tcp_event_kind", "EventKind", "TCP_EV_", {"TCP_EV_KINDS": "KIND_COUNT"}),
            EnumSpec("tcp_retrans_kind", "RetransKind", "TCP_RETRANS_"),
            EnumSpec("tcp_sock_flag", "SockFlag", "TCP_SOCK_", flag=True),
            EnumSpec("tcp_limits"),
            EnumSpec("tcp_own_reason"),
        ),
        {"TcpStat": "EventStat"},
        ("STAT_COUNT",),
        filter="packet",
    ),
    ModuleSpec(
        "dns_abi",
        ("dns",),
        "The dns object (bpf/dns.h, bpf/dns.bpf.c).",
        {
            "dns_config": "DnsConfigC",
            "dns_event": "DnsEvent",
            "dns_group_key": "DnsGroupKey",
            "dns_group": "DnsGroupValue",
            "dns_pending_key": "DnsPendingKey",
            "dns_query": "DnsQueryC",
        },
        (
            EnumSpec("dns_stat", "DnsStat", "DNS_STAT_", {"DNS_STAT_COUNT": "DNS_STAT_COUNT"}),
            EnumSpec("dns_event_kind", "DnsEventKind", "DNS_EVENT_"),
            EnumSpec("dns_limits"),
        ),
        filter="packet",
    ),
    ModuleSpec(
        "route_abi",
        ("route",),
        "The route object (bpf/route.h, bpf/route.bpf.c).",
        {
            "route_config": "RouteConfigC",
            "route_event": "RouteEventC",
            "route_group_key": "RouteGroupKeyC",
            "route_group": "RouteGroupC",
        },
        (
            EnumSpec("route_event_kind", "RouteEventKind", "ROUTE_EV_", {"ROUTE_EV_KINDS": "KIND_COUNT"}),
            EnumSpec("route_neigh_kind", "NeighKind", "ROUTE_NEIGH_"),
            EnumSpec("route_limits"),
        ),
        shared=("STAT_COUNT",),
        filter="packet",
    ),
    ModuleSpec(
        "snoop_abi",
        ("snoop",),
        "The snoop object (bpf/snoop.h, bpf/snoop.bpf.c).",
        {
            "snoop_config": "SnoopConfigC",
            "snoop_event": "SnoopEventC",
            "snoop_group_key": "SnoopGroupKeyC",
            "snoop_group": "SnoopGroupC",
        },
        (
            EnumSpec("snoop_event_kind", "SnoopEventKind", "SNOOP_EV_", {"SNOOP_EV_KINDS": "KIND_COUNT"}),
            EnumSpec("snoop_event_flag", "SnoopFlag", "SNOOP_", flag=True),
            EnumSpec("snoop_limits"),
        ),
        shared=("STAT_COUNT",),
        filter="netns",
    ),
    ModuleSpec(
        "softirq_abi",
        ("softirq",),
        "The softirq object (bpf/softirq.h, bpf/softirq.bpf.c).",
        {
            "softirq_config": "SoftirqConfigC",
            "napi_key": "NapiKeyC",
            "napi_slot": "NapiSlotC",
            "napi_stats": "NapiStatsC",
            "softirq_cpu_state": "SoftirqCpuStateC",
        },
        (
            EnumSpec("softirq_limits"),
            EnumSpec("softirq_hist_kind", "HistKind", "SIRQ_HIST_", {"SIRQ_HIST_KINDS": "HIST_KINDS"}),
            EnumSpec("softirq_counter", "SoftirqCounter", "SIRQ_", {"SIRQ_COUNTERS": "COUNTERS"}),
            EnumSpec("netrx_counter", "NetRxCounter", "NETRX_", {"NETRX_COUNTERS": "NETRX_COUNTERS"}),
        ),
        filter="netns",
    ),
    ModuleSpec(
        "profile_abi",
        ("profile",),
        "The profile object (bpf/profile.h, bpf/profile.bpf.c).",
        {
            "profile_config": "ProfileConfigC",
            "profile_key": "ProfileKeyC",
            "profile_new_pids": "ProfileNewPidsC",
        },
        (
            EnumSpec("profile_limits"),
            EnumSpec("profile_stat", "ProfileStat", "PROFILE_", {"PROFILE_STATS": "PROFILE_STATS"}),
        ),
        filter="netns",
    ),
    ModuleSpec(
        "tcp_existing_abi",
        ("tcp_existing",),
        "The iterator that walks the sockets existing when tcp starts (bpf/tcp_existing.bpf.c).",
    ),
)


class AbiError(Exception):
    """The objects do not hold what a spec names, or disagree about a shared type."""


def _object_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.bpf.o"


def _open_btf(path: Path) -> Btf:
    if not path.exists():
        raise AbiError(f"{path} does not exist: build it with `make bpf`")
    handle = _libbpf.lib().btf__parse(str(path).encode(), None)
    if not handle:
        raise AbiError(f"{path} has no readable BTF")
    return Btf(handle)


def _program_sections(path: Path) -> dict[str, str]:
    """program name -> ELF section, as libbpf reads them (opening an object needs no privilege)."""
    lib = _libbpf.lib()
    # Declared here, not in _libbpf: only the generator (build time) walks an object's programs.
    for name, restype, argtypes in (
        ("bpf_object__next_program", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p]),
        ("bpf_program__section_name", ctypes.c_char_p, [ctypes.c_void_p]),
    ):
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    handle = lib.bpf_object__open_file(str(path).encode(), None)
    if not handle:
        raise AbiError(f"libbpf cannot open {path}")
    try:
        sections: dict[str, str] = {}
        program = lib.bpf_object__next_program(handle, None)
        while program:
            name = lib.bpf_program__name(program).decode()
            sections[name] = lib.bpf_program__section_name(program).decode()
            program = lib.bpf_object__next_program(handle, program)
        return sections
    finally:
        lib.bpf_object__close(handle)


def _ctype_text(ctype: btf_layout.CType, classes: Mapping[str, str]) -> str:
    if isinstance(ctype, btf_layout.ArrayType):
        element = ctype.element
        if isinstance(element, btf_layout.IntType) and element.name == "char":
            return f"ctypes.c_char * {ctype.length}"  # C strings (comm, ifname) read as bytes
        inner = _ctype_text(element, classes)
        if isinstance(element, btf_layout.ArrayType):
            inner = f"({inner})"
        return f"{inner} * {ctype.length}"
    if isinstance(ctype, btf_layout.StructType):
        if ctype.name not in classes:
            raise AbiError(f"struct {ctype.name or '(anonymous)'} is used by a mirror but has no Python name")
        return classes[ctype.name]
    if isinstance(ctype, btf_layout.PointerType):
        return "ctypes.c_uint64"  # kernel addresses are numbers to userspace
    if isinstance(ctype, btf_layout.IntType) and ctype.name == "_Bool":
        return "ctypes.c_bool"
    if isinstance(ctype, btf_layout.IntType) and ctype.name == "char":
        return "ctypes.c_char"
    return f"ctypes.c_{'' if ctype.signed else 'u'}int{ctype.size * 8}"


def _number(value: int) -> str:
    return f"0x{value:X}" if value >= 1 << 31 else str(value)


@dataclass
class _Module:
    """The text of one module being assembled, and what it needs imported."""

    spec: ModuleSpec
    body: list[str] = field(default_factory=list)
    exported: list[str] = field(default_factory=list)
    imports: dict[str, set[str]] = field(default_factory=dict)
    uses_enum: bool = False

    def need(self, module: str, name: str) -> None:
        self.imports.setdefault(module, set()).add(name)


def _struct_order(btf: Btf, structs: Mapping[str, str]) -> list[str]:
    """The spec's structs with each one's nested structs before it (ctypes needs them defined first)."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered or name not in structs:
            return
        for member in btf_layout.struct_members(btf, name) or ():
            ctype = member.ctype
            while isinstance(ctype, btf_layout.ArrayType):
                ctype = ctype.element
            if isinstance(ctype, btf_layout.StructType):
                visit(ctype.name)
        ordered.append(name)

    for name in structs:
        visit(name)
    return ordered


def _emit_structs(module: _Module, btf: Btf, object_name: str, owners: Mapping[str, tuple[str, str]]) -> None:
    classes = {c_name: python for c_name, (_, python) in owners.items()}
    for c_name in _struct_order(btf, module.spec.structs):
        members = btf_layout.struct_members(btf, c_name)
        if members is None:
            raise AbiError(f"{object_name}.bpf.o has no struct {c_name}")
        python = module.spec.structs[c_name]
        lines = [
            "",
            "",
            f"class {python}(ctypes.Structure):",
            f'    """struct {c_name}: {btf.struct_size(c_name)} bytes."""',
            "",
            f'    c_name = "{c_name}"',
            "    __slots__ = ()  # a member renamed in C is an AttributeError, not a new Python attribute",
            "    _fields_ = (",
        ]
        for member in members:
            if member.bits:
                raise AbiError(
                    f"struct {c_name} member {member.name} is a bitfield: keep shared structs simple"
                )
            ctype = member.ctype
            while isinstance(ctype, btf_layout.ArrayType):
                ctype = ctype.element
            if isinstance(ctype, btf_layout.StructType) and ctype.name not in module.spec.structs:
                owner = owners.get(ctype.name)
                if owner is None:
                    raise AbiError(f"struct {ctype.name} (in {c_name}) is in no module's spec")
                module.need(owner[0], owner[1])
            lines.append(f'        ("{member.name}", {_ctype_text(member.ctype, classes)}),')
        if len(members) == 1:  # ruff's format for a one-element tuple
            lines[-2:] = [f"    _fields_ = ({lines[-1].strip()})"]
        else:
            lines.append("    )")
        module.body.extend(lines)
        module.exported.append(python)


def _emit_enums(module: _Module, btf: Btf, object_name: str) -> None:
    for spec in module.spec.enums:
        values = btf.enum(spec.c_name)
        if values is None:
            raise AbiError(
                f"{object_name}.bpf.o has no enum {spec.c_name} in its BTF: name it in the object's "
                "*_abi_types struct (bpf/abi.h)"
            )
        if spec.python_name is None:
            module.body.extend(["", "", f"# enum {spec.c_name}"])
            for name, value in values.items():
                module.body.append(f"{name} = {_number(value)}")
                module.exported.append(name)
            continue
        base = "enum.IntFlag" if spec.flag else "KernelEnum"
        if not spec.flag:
            module.need("netsleuth.bpf.abi", "KernelEnum")
        lines = ["", "", f"class {spec.python_name}({base}):", f'    """enum {spec.c_name}."""', ""]
        counts: list[str] = []
        for name, value in values.items():
            short = name.removeprefix(spec.prefix)
            if name in spec.counts:
                module.uses_enum = True
                lines.append(f"    {short} = enum.nonmember({_number(value)})")
                counts.append(f"{spec.counts[name]} = {_number(value)}")
                module.exported.append(spec.counts[name])
            else:
                lines.append(f"    {short} = {_number(value)}")
        if spec.flag:
            module.uses_enum = True
        module.body.extend(lines)
        if counts:
            module.body.append("")
            module.body.append("")
            module.body.extend(counts)
        module.exported.append(spec.python_name)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _rodata_type(
    btf: Btf, type_id: int, owners: Mapping[str, tuple[str, str]], module: _Module
) -> str | None:
    """The ctypes type of a .rodata variable; None for what userspace never sets (the NS_ABI_KEEP structs)."""
    ctype = btf_layout.describe(btf, type_id)
    if isinstance(ctype, btf_layout.StructType):
        if ctype.name.endswith("_abi_types"):
            return None
        owner = owners.get(ctype.name)
        if owner is None:
            raise AbiError(f"struct {ctype.name} (a .rodata variable) has no Python name in any ModuleSpec")
        if ctype.name not in module.spec.structs:
            module.need(owner[0], owner[1])
        return owner[1]
    if isinstance(ctype, btf_layout.IntType | btf_layout.EnumType):
        return _ctype_text(btf_layout.IntType(ctype.name, ctype.size, False), {})
    return None


def _check_filter(spec: ModuleSpec, btf: Btf, maps: Sequence[str], object_name: str) -> None:
    """The shared filter the Python code fills (netsleuth.diagnostics.filter_maps) must be in the object:
    a map or config field renamed in C fails here, at `make bpf`/`make check-bpf`, not in a run."""
    if not spec.filter:
        return
    wanted_maps = FILTER_MAPS[spec.filter]
    missing = [name for name in wanted_maps if name not in maps]
    if missing:
        raise AbiError(
            f"{object_name}.bpf.o has no map {', '.join(missing)}: every object with the {spec.filter} "
            "filter declares it (bpf/filter_maps.bpf.h); netsleuth.diagnostics.filter_maps fills it"
        )
    config = next((c_name for c_name in spec.structs if c_name.endswith("_config")), None)
    fields = {member.name for member in btf_layout.struct_members(btf, config) or ()} if config else set()
    absent = [name for name in FILTER_FIELDS[spec.filter] if name not in fields]
    if absent:
        raise AbiError(
            f"{object_name}.bpf.o's struct {config} has no {', '.join(absent)}: the {spec.filter} filter's "
            "fields (netsleuth.diagnostics.filter_maps.fill_filter_config) are in every config that uses it"
        )


def _emit_tables(module: _Module, btf: Btf, path: Path, owners: Mapping[str, tuple[str, str]]) -> None:
    object_name = module.spec.objects[0]
    prefix = _camel(object_name)
    module.need("netsleuth.bpf.abi", "Program")
    module.need("netsleuth.bpf.abi", "RodataVar")
    for name in ("MapAttr", "ObjectMaps", "Skeleton"):
        module.need("netsleuth.bpf.skeleton", name)
    definitions = btf_layout.map_definitions(btf)
    _check_filter(module.spec, btf, [definition.name for definition in definitions], object_name)
    programs = sorted(_program_sections(path).items())
    body = module.body
    body.extend(["", "", "# max_entries of every map in .maps (ring buffers: bytes)."])
    body.append("MAP_MAX_ENTRIES: dict[str, int] = {")
    for definition in definitions:
        body.append(f'    "{definition.name}": {definition.max_entries},')
    body.append("}")
    body.extend(["", "", f"class {prefix}Maps(ObjectMaps):"])
    body.append(
        f'    """The maps of {object_name}.bpf.o: names and sizes here, BpfMaps on a loaded object."""'
    )
    body.extend(["", f'    object_name = "{object_name}"'])
    for definition in definitions:
        body.append(f"    {definition.name} = MapAttr({definition.max_entries})")
    body.extend(["", "", f"class {prefix}Programs:"])
    body.extend(
        [
            f'    """The programs of {object_name}.bpf.o and the hook each attaches to (its ELF section)."""',
            "",
        ]
    )
    for name, section in programs:
        attach, _, rest = section.partition("/")
        tracepoint = rest.rpartition("/")[2]  # tracepoint/<category>/<name> keeps the name only
        arguments = f'"{section}", "{attach}", "{tracepoint}", "{name}"'
        line = f"    {name} = Program({arguments})"
        body.extend(
            [line] if len(line) <= _LINE else [f"    {name} = Program(", f"        {arguments}", "    )"]
        )
    body.extend(["", "", "# Every program by name."])
    body.append("PROGRAMS: dict[str, Program] = {")
    for name, _ in programs:
        body.append(f'    "{name}": {prefix}Programs.{name},')
    body.append("}")
    variables = []
    for name, type_id in btf_layout.datasec_variables(btf, ".rodata"):
        ctype = _rodata_type(btf, btf.record(type_id).size_or_type, owners, module)  # type: ignore[union-attr]
        if ctype is not None:
            variables.append(f'    {name} = RodataVar("{name}", {ctype})')
    body.extend(["", "", f"class {prefix}Rodata:"])
    body.append(
        f'    """The `const volatile` globals of {object_name}.bpf.o\'s .rodata, written before load."""'
    )
    body.extend(["", *(variables or ["    pass"])])
    body.extend(["", "", f"class {prefix}Object(Skeleton[{prefix}Maps]):"])
    body.extend(
        [
            f'    """{object_name}.bpf.o opened: `maps` bound to it, `programs` and `rodata` its names."""',
            "",
            f'    object_name = "{object_name}"',
            f"    Maps = {prefix}Maps",
            f"    programs = {prefix}Programs",
            f"    rodata = {prefix}Rodata",
        ]
    )
    module.exported.extend(
        [
            "MAP_MAX_ENTRIES",
            "PROGRAMS",
            f"{prefix}Maps",
            f"{prefix}Programs",
            f"{prefix}Rodata",
            f"{prefix}Object",
        ]
    )


def _all_sort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: SCREAMING_CASE, then CamelCase, then the rest.
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def _render(module: _Module) -> str:
    spec = module.spec
    module.exported.extend(spec.aliases)
    sources = ", ".join(f"{name}.bpf.o" for name in spec.objects)
    lines = [
        f'"""{spec.doc}',
        "",
        f"Generated by netsleuth.bpf.abigen from the BTF of {sources}: do not edit. Change bpf/*.h and run",
        "`make bpf`; `make check-bpf` fails while this file is stale, and netsleuth.bpf.abi.check_mirror",
        "refuses a mirror that no longer matches the object it loads.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "import ctypes",
    ]
    if module.uses_enum:
        lines.append("import enum")
    if module.imports:
        lines.append("")
        for name in sorted(module.imports):
            lines.append(f"from {name} import {', '.join(sorted(module.imports[name], key=_all_sort_key))}")
    lines.append("")
    lines.append("__all__ = [")
    lines.extend(f'    "{name}",' for name in sorted(module.exported, key=_all_sort_key))
    lines.append("]")
    lines.extend(module.body)
    if spec.aliases:
        lines.extend(["", ""])
        lines.append("# Names the Python code used before these types were shared between objects.")
        lines.extend(f"{alias} = {target}" for alias, target in spec.aliases.items())
    return "\n".join(lines) + "\n"


def _owners(modules: Sequence[ModuleSpec] = ()) -> dict[str, tuple[str, str]]:
    """C struct -> (generated module, Python class), over every module (and those being generated)."""
    owners: dict[str, tuple[str, str]] = {}
    for spec in (*MODULES, *modules):
        for c_name, python in spec.structs.items():
            owners[c_name] = (f"netsleuth._generated.{spec.name}", python)
    return owners


def _needs_from_shared(module: _Module) -> None:
    for name in module.spec.shared:
        module.need(f"netsleuth._generated.{MODULES[0].name}", name)
        module.exported.append(name)


def _needs_from_aliases(module: _Module) -> None:
    # An alias of a name another module generates (DropStat = EventStat) imports it.
    for target in module.spec.aliases.values():
        if target not in module.exported:
            for other in MODULES:
                if any(enum_spec.python_name == target for enum_spec in other.enums):
                    module.need(f"netsleuth._generated.{other.name}", target)


def generate(directory: Path = GENERATED, modules: Sequence[ModuleSpec] = MODULES) -> dict[str, str]:
    """module file name -> text, read from the objects in `directory`."""
    owners = _owners(modules)
    texts: dict[str, str] = {}
    for spec in modules:
        rendered: dict[str, str] = {}
        for object_name in spec.objects:
            path = _object_path(directory, object_name)
            with _open_btf(path) as btf:
                module = _Module(spec)
                _emit_enums(module, btf, object_name)
                _emit_structs(module, btf, object_name, owners)
                if spec.tables:
                    if len(spec.objects) != 1:
                        raise AbiError(f"{spec.name}: tables come from exactly one object")
                    _emit_tables(module, btf, path, owners)
                _needs_from_aliases(module)
                _needs_from_shared(module)
                rendered[object_name] = _render(module)
        first = spec.objects[0]
        for object_name, text in rendered.items():
            if text != rendered[first]:
                raise AbiError(
                    f"{first}.bpf.o and {object_name}.bpf.o disagree about the types of {spec.name}: "
                    "a shared header changed in one build only (run `make bpf`)"
                )
        texts[f"{spec.name}.py"] = rendered[first]
    return texts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m netsleuth.bpf.abigen", description="Generate netsleuth's Python ABI from BPF objects."
    )
    parser.add_argument("--objects", type=Path, default=GENERATED, help="where the .bpf.o files are")
    parser.add_argument("--out", type=Path, default=GENERATED, help="where the modules go")
    parser.add_argument("--check", action="store_true", help="fail when a committed module is stale")
    options = parser.parse_args(argv)
    try:
        texts = generate(options.objects)
    except (AbiError, EnvironmentProblem) as error:
        print(f"abigen: {error}", file=sys.stderr)
        return 2
    stale = []
    for name, text in texts.items():
        target = options.out / name
        current = target.read_text() if target.exists() else None
        if current == text:
            continue
        if options.check:
            stale.append(str(target))
        else:
            target.write_text(text)
            print(f"abigen: wrote {target}")
    for path in stale:
        print(f"{path} is stale: run 'make bpf' and commit it", file=sys.stderr)
    if options.check and not stale:
        print(f"generated ABI matches the objects ({len(texts)} modules checked)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
