"""`diagnose`: path health and the kernel's own drop and reset accounting, watched together, turned into
ranked verdicts. Nothing here prints; commands/diagnose.py and render/verdicts_text.py do."""
