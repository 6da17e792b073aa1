"""Diagnostics: config in, typed records out. None of them prints; renderers and commands do."""
