"""Read-only views of the running kernel: symbols (kallsyms), source lines (symbolizer), network namespaces,
socket owners and containers.

Nothing here loads BPF or changes the machine; every root (/proc, /run/netns, the kallsyms file) is a
parameter so the views run on recorded fixtures in unit tests.
"""

__all__: list[str] = []
