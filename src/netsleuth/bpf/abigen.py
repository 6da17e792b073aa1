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
    tables: bool = True  # maps' sizes and programs of its one object


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


def _emit_tables(module: _Module, btf: Btf, path: Path) -> None:
    module.need("netsleuth.bpf.abi", "Program")
    module.body.extend(["", "", "# max_entries of every map in .maps (ring buffers: bytes)."])
    module.body.append("MAP_MAX_ENTRIES: dict[str, int] = {")
    for definition in btf_layout.map_definitions(btf):
        module.body.append(f'    "{definition.name}": {definition.max_entries},')
    module.body.append("}")
    module.body.extend(["", "# Every program and the hook it attaches to, from its ELF section."])
    module.body.append("PROGRAMS: dict[str, Program] = {")
    for name, section in sorted(_program_sections(path).items()):
        attach, _, rest = section.partition("/")
        tracepoint = rest.rpartition("/")[2]  # tracepoint/<category>/<name> keeps the name only
        module.body.append(f'    "{name}": Program("{section}", "{attach}", "{tracepoint}"),')
    module.body.append("}")
    module.exported.extend(["MAP_MAX_ENTRIES", "PROGRAMS"])


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
        lines.append("")
        lines.append("# Names the Python code used before these types were shared between objects.")
        lines.extend(f"{alias} = {target}" for alias, target in spec.aliases.items())
    return "\n".join(lines) + "\n"


def _owners() -> dict[str, tuple[str, str]]:
    """C struct -> (generated module, Python class), over every module."""
    owners: dict[str, tuple[str, str]] = {}
    for spec in MODULES:
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


def generate(directory: Path = GENERATED) -> dict[str, str]:
    """module file name -> text, read from the objects in `directory`."""
    owners = _owners()
    texts: dict[str, str] = {}
    for spec in MODULES:
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
                    _emit_tables(module, btf, path)
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
