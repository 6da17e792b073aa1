"""Folded stacks -> a self-contained, interactive SVG flame graph (the layout of Brendan Gregg's
flamegraph.pl: root at the bottom, each frame as wide as its samples, children ordered by name).

Interactive with no external file: click a frame to zoom to it (its ancestors stay full width), click the
root or press Escape to reset, type in the search box (or press Ctrl-F) to highlight matching frames with
the share of samples they cover. Kernel frames (ending in `_[k]`) are drawn in orange, user frames in red
and yellow, as flamegraph.pl colours them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

__all__ = ["FrameNode", "build_tree", "flamegraph_svg"]

_WIDTH = 1200
_FRAME_HEIGHT = 16
_TOP = 60
_BOTTOM = 30
_FONT = 12
_MIN_WIDTH = 0.1  # pixels: narrower frames are left out (their samples still count in the parent)


@dataclass
class FrameNode:
    name: str
    value: int = 0
    children: dict[str, FrameNode] = field(default_factory=dict)

    def child(self, name: str) -> FrameNode:
        node = self.children.get(name)
        if node is None:
            node = self.children[name] = FrameNode(name)
        return node


def build_tree(stacks: Iterable[tuple[tuple[str, ...], int]]) -> FrameNode:
    """(frames root -> leaf, count) -> a tree whose root ("all") holds every sample."""
    root = FrameNode("all")
    for frames, count in stacks:
        root.value += count
        node = root
        for frame in frames:
            node = node.child(frame)
            node.value += count
    return root


def _depth(node: FrameNode) -> int:
    return 1 + max((_depth(child) for child in node.children.values()), default=0)


def _colour(name: str) -> str:
    digest = hashlib.md5(name.encode(), usedforsecurity=False).digest()
    if name.endswith("_[k]"):
        return f"rgb({205 + digest[0] % 50},{100 + digest[1] % 80},{digest[2] % 40})"
    if name.startswith("["):
        return f"rgb({150 + digest[0] % 40},{150 + digest[0] % 40},{150 + digest[0] % 40})"
    return f"rgb({205 + digest[0] % 50},{digest[1] % 230},{digest[2] % 55})"


_SCRIPT = """
<script type="text/ecmascript"><![CDATA[
(function () {
  var svg = document.documentElement, W = %(width)d, PAD = 10, total = %(total)d;
  var frames = Array.prototype.slice.call(document.querySelectorAll("g.f"));
  var details = document.getElementById("details"), matched = document.getElementById("matched");
  function num(g, k) { return parseFloat(g.getAttribute("data-" + k)); }
  function place(g, x, w) {
    var r = g.querySelector("rect"), t = g.querySelector("text");
    r.setAttribute("x", x); r.setAttribute("width", w);
    t.setAttribute("x", x + 3);
    var name = g.getAttribute("data-n"), fit = Math.floor((w - 6) / 7);
    t.textContent = fit < 3 ? "" : (name.length <= fit ? name : name.slice(0, fit - 2) + "..");
    g.style.display = w < 0.1 ? "none" : "";
  }
  function zoom(g) {
    var x0 = num(g, "x"), w0 = num(g, "w"), d0 = num(g, "d");
    frames.forEach(function (f) {
      var x = num(f, "x"), w = num(f, "w"), d = num(f, "d");
      if (d < d0 && x <= x0 + 1e-9 && x + w >= x0 + w0 - 1e-9) {
        place(f, PAD, W - 2 * PAD);
        f.style.opacity = 0.6;
        return;
      }
      f.style.opacity = 1;
      if (d >= d0 && x >= x0 - 1e-9 && x + w <= x0 + w0 + 1e-9) {
        place(f, PAD + (x - x0) / w0 * (W - 2 * PAD), w / w0 * (W - 2 * PAD));
      } else { f.style.display = "none"; }
    });
  }
  function reset() {
    frames.forEach(function (f) {
      f.style.opacity = 1;
      place(f, PAD + num(f, "x") * (W - 2 * PAD), num(f, "w") * (W - 2 * PAD));
    });
  }
  function search(term) {
    var covered = 0, spans = [];
    frames.forEach(function (f) {
      var hit = term && f.getAttribute("data-n").indexOf(term) >= 0;
      f.querySelector("rect").setAttribute("fill", hit ? "rgb(230,0,230)" : f.getAttribute("data-c"));
      if (hit) { spans.push([num(f, "x"), num(f, "x") + num(f, "w")]); }
    });
    spans.sort(function (a, b) { return a[0] - b[0]; });
    var end = -1;
    spans.forEach(function (s) {
      if (s[0] >= end) { covered += s[1] - s[0]; end = s[1]; }
      else if (s[1] > end) { covered += s[1] - end; end = s[1]; }
    });
    matched.textContent = term ? "Matched: " + (covered * 100).toFixed(1) + "%%" : "";
  }
  frames.forEach(function (f) {
    f.addEventListener("click", function () { if (num(f, "d") === 0) { reset(); } else { zoom(f); } });
    f.addEventListener("mouseover", function () {
      details.textContent = f.querySelector("title").textContent;
    });
    f.addEventListener("mouseout", function () { details.textContent = " "; });
  });
  function ask() { var term = prompt("Search frames (substring):", ""); if (term !== null) { search(term); } }
  document.getElementById("search").addEventListener("click", ask);
  document.getElementById("reset").addEventListener("click", function () { reset(); search(""); });
  window.addEventListener("keydown", function (e) {
    if (e.key === "Escape") { reset(); search(""); }
    if ((e.ctrlKey || e.metaKey) && e.key === "f") { e.preventDefault(); ask(); }
  });
})();
]]></script>
"""


def flamegraph_svg(stacks: Iterable[tuple[tuple[str, ...], int]], title: str, subtitle: str = "") -> str:
    """An SVG document (text) for `stacks`: (frames root -> leaf, samples)."""
    root = build_tree(stacks)
    depth = _depth(root)
    height = _TOP + depth * _FRAME_HEIGHT + _BOTTOM
    usable = _WIDTH - 20
    total = max(root.value, 1)
    parts = [
        '<?xml version="1.0" standalone="no"?>',
        f'<svg version="1.1" width="{_WIDTH}" height="{height}" viewBox="0 0 {_WIDTH} {height}" '
        'xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">',
        f"<style>text {{ font-family: Verdana, sans-serif; font-size: {_FONT}px; fill: rgb(0,0,0); }} "
        "g.f:hover rect { stroke: black; stroke-width: 0.5; cursor: pointer; } "
        ".ui { cursor: pointer; fill: rgb(0,0,160); }</style>",
        f'<rect x="0" y="0" width="{_WIDTH}" height="{height}" fill="rgb(250,250,235)"/>',
        f'<text x="{_WIDTH // 2}" y="24" text-anchor="middle" style="font-size:17px">{escape(title)}</text>',
        f'<text x="{_WIDTH // 2}" y="42" text-anchor="middle" fill="rgb(90,90,90)">{escape(subtitle)}</text>',
        '<text id="reset" class="ui" x="10" y="24">Reset Zoom</text>',
        f'<text id="search" class="ui" x="{_WIDTH - 70}" y="24">Search</text>',
        f'<text id="matched" x="{_WIDTH - 140}" y="{height - 10}"> </text>',
        f'<text id="details" x="10" y="{height - 10}"> </text>',
    ]

    def emit(node: FrameNode, x: float, level: int) -> None:
        width = node.value / total
        if width * usable < _MIN_WIDTH:
            return
        y = height - _BOTTOM - (level + 1) * _FRAME_HEIGHT
        colour = "rgb(230,230,230)" if level == 0 else _colour(node.name)
        share = 100.0 * node.value / total
        label = f"{node.name} ({node.value} samples, {share:.2f}%)"
        pixel_x, pixel_w = 10 + x * usable, width * usable
        fit = int((pixel_w - 6) // 7)
        text = node.name if len(node.name) <= fit else (node.name[: fit - 2] + ".." if fit >= 3 else "")
        parts.append(
            f'<g class="f" data-n={quoteattr(node.name)} data-x="{x:.9f}" data-w="{width:.9f}" '
            f'data-d="{level}" data-c="{colour}"><title>{escape(label)}</title>'
            f'<rect x="{pixel_x:.2f}" y="{y}" width="{pixel_w:.2f}" height="{_FRAME_HEIGHT - 1}" '
            f'fill="{colour}" rx="2" ry="2"/>'
            f'<text x="{pixel_x + 3:.2f}" y="{y + _FRAME_HEIGHT - 4}">{escape(text)}</text></g>'
        )
        offset = x
        for name in sorted(node.children):
            child = node.children[name]
            emit(child, offset, level + 1)
            offset += child.value / total

    emit(root, 0.0, 0)
    parts.append(_SCRIPT % {"width": _WIDTH, "total": total})
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
