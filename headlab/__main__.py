"""`python -m headlab` and the `headlab` command. The command line is imported here, under a
guard (torch and pandas take seconds to load), so a Ctrl-C while it loads ends like every other
interruption: one line and status 130, not a traceback."""

import importlib
import sys

EXIT_INTERRUPTED = 130


def run() -> int:
    try:
        cli = importlib.import_module("headlab.cli.main")
    except KeyboardInterrupt:
        print("headlab: error: interrupted while starting; nothing was done", file=sys.stderr)
        return EXIT_INTERRUPTED
    return cli.main()


if __name__ == "__main__":  # not when a spawned worker process imports this module as __mp_main__
    sys.exit(run())
