"""Stacks -> speedscope's file format (https://www.speedscope.app/file-format-schema.json): one "sampled"
profile whose samples are frame-index stacks (root first) weighted by their sample counts. Opens in
https://www.speedscope.app or `speedscope FILE`, and is plain JSON for anything else."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["speedscope_document"]

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def speedscope_document(stacks: Iterable[tuple[tuple[str, ...], int]], name: str) -> dict[str, Any]:
    frame_index: dict[str, int] = {}
    frames: list[dict[str, str]] = []
    samples: list[list[int]] = []
    weights: list[int] = []
    for stack, count in stacks:
        indices = []
        for frame in stack:
            index = frame_index.get(frame)
            if index is None:
                index = frame_index[frame] = len(frames)
                frames.append({"name": frame})
            indices.append(index)
        samples.append(indices)
        weights.append(count)
    total = sum(weights)
    return {
        "$schema": SCHEMA,
        "exporter": "netsleuth",
        "name": name,
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": [
            {
                "type": "sampled",
                "name": name,
                "unit": "none",
                "startValue": 0,
                "endValue": total,
                "samples": samples,
                "weights": weights,
            }
        ],
    }
