"""The loader layer: the only Python that touches libbpf."""

from netsleuth.bpf.errors import BpfError, MissingFeature, VerifierError
from netsleuth.bpf.object import BpfObject

__all__ = ["BpfError", "BpfObject", "MissingFeature", "VerifierError"]
