"""`python -m netsleuth` and the `netsleuth` console script (pyproject.toml points it at `main`)."""

import sys


def main() -> int:
    # Garbage collection is held off before the CLI's own imports (argparse, dataclasses...): they are part
    # of a trace's start too. cli.main resumes it at once for a command that does not attach, and
    # run_session once the probes are attached (netsleuth.startup_gc).
    from netsleuth.startup_gc import pause_collection

    pause_collection()
    from netsleuth.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
