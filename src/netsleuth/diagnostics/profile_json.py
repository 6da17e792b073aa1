"""The JSON of `profile` records, declared as typed dictionaries for netsleuth.diagnostics.record_schemas
(which makes their JSON Schemas and checks every printed record against them)."""

from __future__ import annotations

from typing import Literal, TypedDict

from netsleuth.diagnostics.record_parts import Clock

__all__ = ["PROFILE_RECORD_TYPES"]


class StackJson(TypedDict):
    type: Literal["stack"]
    v: int
    pid: int
    comm: str
    count: int  # samples with exactly these frames
    frames: list[str]  # root (process name) first; kernel frames end in "_[k]"
    in_softirq: bool
    kernel_lost: bool
    user_lost: bool


class _TopFunction(TypedDict):
    function: str
    samples: int


class ProfileSummaryJson(TypedDict):
    type: Literal["summary"]
    v: int
    diagnostic: Literal["profile"]
    hz: int
    cpus: int
    seconds: float
    softirq: str | None
    samples: int  # the clock fired, every CPU and task
    matched: int  # passed the filters: exact
    kernel_stack_lost: int
    user_stack_lost: int
    uncounted: int
    idle: int
    stacks: int
    counted: int  # the stacks' counts summed: matched - uncounted
    top_functions: list[_TopFunction]
    outputs: list[str]
    attach: str
    interrupted: bool
    clock: Clock


PROFILE_RECORD_TYPES: dict[str, type] = {"stack": StackJson, "summary:profile": ProfileSummaryJson}
