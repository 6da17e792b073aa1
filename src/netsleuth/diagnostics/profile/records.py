"""`profile`'s config and records: what a user asks for, each distinct stack with its samples, and the
summary with the exact totals of the sampling window."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from netsleuth.spec.common import TaskCountConfig
from netsleuth.spec.options import Opt, SoftirqName
from netsleuth.spec.records import Record
from netsleuth.spec.summary import Summary

__all__ = ["MAX_HZ", "ProfileConfig", "ProfileSummary", "StackRecord", "TopFunction"]

MAX_HZ = 10_000
Hz = Annotated[int, Meta(ge=1, le=MAX_HZ)]


class ProfileConfig(TaskCountConfig, frozen=True, kw_only=True):
    hz: Annotated[Hz, Opt("samples per second on each CPU (default 99)", label="samples per second")] = 99
    kernel_only: Annotated[bool, Opt("kernel stacks only")] = False
    include_idle: Annotated[bool, Opt("also sample the idle task")] = False
    softirq: Annotated[
        SoftirqName | None,
        Opt("only samples taken while this softirq runs: NET_RX or NET_TX", metavar="VECTOR"),
    ] = None

    @property
    def kernel_stacks_only(self) -> bool:
        """--kernel-only, or --softirq: a softirq's samples are its kernel stacks."""
        return self.kernel_only or self.softirq is not None

    def softirq_note(self) -> str | None:
        """What a task filter means with --softirq: a softirq runs in whichever task it interrupts (or in
        ksoftirqd), so the samples are the softirq work done in the selected tasks' time, not the work for
        their packets. Said with the results, so the figures are not read as the latter."""
        if self.softirq is None:
            return None
        flags = [f"--{key}" for key in ("pid", "comm", "netns", "cgroup") if getattr(self, key) is not None]
        if not flags:
            return None
        vector, given = self.softirq.upper(), " and ".join(flags)
        return (
            f"with --softirq {vector}, {given} select the tasks the {vector} softirq interrupted (it runs in "
            f"whichever task is on the CPU, or in ksoftirqd): these samples are the {vector} work done in "
            "their time, not the work for their packets"
        )


class StackRecord(Record, frozen=True, kw_only=True, tag="stack"):
    """One distinct (process, kernel stack, user stack) and how many samples it got."""

    pid: int
    comm: str
    count: int  # samples with exactly these frames
    frames: tuple[str, ...]  # root (the process name) first; kernel frames end in "_[k]"
    in_softirq: bool
    kernel_lost: bool
    user_lost: bool

    @property
    def folded(self) -> str:
        """The stack as flamegraph.pl's input line: `frame;frame;frame count`."""
        return ";".join(frame.replace(";", ":") for frame in self.frames) + f" {self.count}"


class TopFunction(msgspec.Struct, frozen=True, kw_only=True):
    function: str  # a leaf frame
    samples: int


class ProfileSummary(Summary, frozen=True, kw_only=True, tag="summary"):
    """`total` is `matched`, `seen` is `samples` and `ungrouped` is `uncounted`: the run loop's totals."""

    hz: int
    cpus: int
    seconds: float  # the sampling window
    softirq: str | None
    samples: int  # the clock fired, every CPU and task
    matched: int  # passed the filters: exact
    kernel_stack_lost: int
    user_stack_lost: int
    uncounted: int  # found the counts table full: in the totals, in no stack
    idle: int
    stacks: int
    counted: int  # the stacks' counts summed: matched - uncounted
    top_functions: tuple[TopFunction, ...]
    outputs: tuple[str, ...]  # the files written (--folded, --svg, --speedscope)
