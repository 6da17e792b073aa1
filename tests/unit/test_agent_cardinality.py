"""The cardinality guard: at most N series, largest first, sticky, and an `other` that never goes down."""

from __future__ import annotations

import random

import pytest

from netsleuth.spec.cardinality import SeriesGuard


def test_admits_the_largest_up_to_the_limit() -> None:
    guard: SeriesGuard[str] = SeriesGuard(2)
    assert guard.admit({"a": 1, "b": 50, "c": 20}) == {"b", "c"}
    assert guard.folded == 1


def test_a_folded_key_is_never_promoted_and_an_admitted_one_stays() -> None:
    guard: SeriesGuard[str] = SeriesGuard(2)
    guard.admit({"a": 10, "b": 20, "c": 1})
    # c overtakes everyone: promoting it would take its count out of `other`, which would then fall.
    assert guard.admit({"a": 10, "b": 20, "c": 1000}) == {"a", "b"}


def test_a_retired_key_frees_its_slot_for_a_new_one() -> None:
    guard: SeriesGuard[str] = SeriesGuard(2)
    guard.admit({"a": 10, "b": 20, "c": 1})
    assert guard.admit({"b": 20, "c": 1, "d": 5}) == {"b", "d"}  # c stays folded; d is new


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SeriesGuard(0)


def test_other_is_monotonic_and_sums_are_exact_under_churn() -> None:
    """Random growth, new keys and retirements (a retired key's count moves into `other`)."""
    rng = random.Random(7)
    guard: SeriesGuard[int] = SeriesGuard(5)
    live: dict[int, int] = {}
    retired_total = 0
    previous_other = 0
    next_key = 0
    for _ in range(500):
        for _ in range(rng.randint(0, 3)):
            live[next_key] = rng.randint(1, 100)
            next_key += 1
        for key in list(live):
            live[key] += rng.randint(0, 50)
        if live and rng.random() < 0.2:
            retired_total += live.pop(rng.choice(list(live)))
        admitted = guard.admit(live)
        assert len(admitted) <= 5
        other = retired_total + sum(count for key, count in live.items() if key not in admitted)
        assert other >= previous_other
        assert other + sum(live[key] for key in admitted) == retired_total + sum(live.values())
        previous_other = other
