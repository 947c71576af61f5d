"""`python -m headlab` and the `headlab` command. The command line loads in two steps: its parser
(quick: `--help`, `--version` and a usage error answer from it alone), then, for a command to
run, the modules that run it (torch and pandas: seconds). A path the command names that cannot be
right (missing, the wrong kind, unreadable) is reported between the two, before torch loads. Both
load under one guard, so a Ctrl-C before the command starts ends like every other interruption: one
line and status 130, not a traceback; so does memory that runs out while they load (`ulimit -v`): one line, status 2.

The guard records the signal instead of raising: a KeyboardInterrupt raised inside an import can
land in one of importlib's internal callbacks, where Python prints "Exception ignored" and goes on,
so the interruption would be lost and the command would run anyway."""

import importlib
import os
import signal
import sys

EXIT_INPUT, EXIT_INTERRUPTED = 2, 130  # as headlab.cli.main has them, which this module cannot load early


def run() -> int:
    interrupted = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
    try:
        resources = importlib.import_module("headlab.cli.resources")  # light: memory and terminal failures
        resources.encodable_output()
        try:
            parser = importlib.import_module("headlab.cli.parser")
            args = parser.parse_arguments()  # --help ends here, without torch
            problem = parser.path_problem(args)  # so does a mistyped path
            if not problem:
                # The command's own module before headlab.cli.main: it loads numpy before torch, so memory
                # that runs out (ulimit -v) fails mapping torch's library, an ImportError, not inside torch's
                # static initialisers, which abort the process (std::bad_alloc).
                parser.handler_place(args.handler)
            cli = None if problem else importlib.import_module("headlab.cli.main")
        except (ImportError, OSError, MemoryError) as error:
            if not resources.out_of_memory(error):
                raise  # a broken installation: its traceback says which package
            message = resources.memory_message(error, "loading its libraries (torch, scipy)")
            print(f"headlab: error: {message}", file=sys.stderr)
            sys.stderr.flush()
            # Out of memory half-way through loading native libraries, their threads and finalizers
            # can spin for ever at exit (seen under ulimit -v): nothing was done, so leave at once.
            os._exit(EXIT_INPUT)
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupted:
        print("headlab: error: interrupted while starting; nothing was done", file=sys.stderr)
        return EXIT_INTERRUPTED
    if problem:
        print(f"headlab: error: {parser.printable(problem)}", file=sys.stderr)
        return EXIT_INPUT
    return cli.run(args)


if __name__ == "__main__":  # not when a spawned worker process imports this module as __mp_main__
    sys.exit(run())
