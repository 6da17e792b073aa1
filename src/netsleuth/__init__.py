"""netsleuth: tells Linux operators why their network misbehaves."""

__all__ = ["__version__"]

__version__ = "0.1.0"
