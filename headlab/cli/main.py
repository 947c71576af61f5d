"""The command line run: `main` parses (headlab.cli.parser), calls the subcommand's handler
(headlab.cli.model_commands for `info` and `train`, headlab.cli.report_commands for `report` and
`docs`, headlab.cli.commands for the others: only the handler's own module is loaded) and ends
every error in one line and an exit status (the list in `headlab --help`)."""

from __future__ import annotations

import os
import sys
import traceback

from headlab.cli.parser import DEBUG_ENV, handler_place, parse_arguments, path_problem, printable
from headlab.cli.resources import encodable_output, memory_message, one_line_warnings, out_of_memory
from headlab.io.files import silence_stdout
from headlab.training.processes import FailedOnAnotherRank, abandon, in_process_group, launched_processes


def _one_line(error: BaseException) -> str:
    """The message of a user error; an OSError as 'what: which file', with the usual fix."""
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        return f"{error.strerror}{where} (check the path, its permissions and free disk space)"
    return str(error)

USER_ERRORS = (ValueError, RuntimeError, OSError, TypeError, OverflowError, KeyError)  # what bad input raises
EXIT_INPUT, EXIT_BUG, EXIT_INTERRUPTED, EXIT_CLOSED_OUTPUT = 2, 1, 130, 141

def main(argv: list[str] | None = None) -> int:
    return run(parse_arguments(argv))


def run(args) -> int:
    """Run the parsed command `args` (what `parse_arguments` returns): its status, every error one line."""
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    encodable_output()
    one_line_warnings()
    try:
        problem = path_problem(args)  # `python -m headlab` tells it before torch loads; a call in-process here
        if problem:
            raise ValueError(problem)
        module, function = handler_place(args.handler)
        return getattr(module, function)(args)
    except KeyboardInterrupt as error:
        if debug and not in_process_group():
            raise
        status = _say(error, "interrupted; a run folder resumes from its last checkpoint (--resume)", EXIT_INTERRUPTED,
                      debug)
    except BrokenPipeError:  # stdout closed by its reader: not a disk problem, nothing to say
        silence_stdout()
        return EXIT_CLOSED_OUTPUT
    except (MemoryError, *USER_ERRORS) as error:  # bad values (also in parsed JSON), files, folders in use, full disks
        if debug and not in_process_group():
            raise
        doing = f"running {getattr(args, 'command', 'the command')}"
        message = memory_message(error, doing) if out_of_memory(error) else _one_line(error)
        status = _say(error, message, EXIT_INPUT, debug)
    except Exception as error:  # a defect: still one line, said to be a bug
        if debug and not in_process_group():
            raise
        status = _say(error, f"internal error {type(error).__name__}: {str(error)[:300]} (a bug in headlab: please "
                             "report it with the output of --debug)", EXIT_BUG, debug)
    if in_process_group():  # the other ranks may never reach the exit barrier: end now
        abandon(status)
    return status

def _say(error: BaseException, message: str, status: int, debug: bool) -> int:
    """Print `message` (or, with --debug under torchrun, the traceback) if this process reports
    `error`, and return `status`. Under torchrun rank 0 prints every error (another rank's failure
    reaches it as `FailedOnAnotherRank`); another rank prints only a failure of its own after the
    ranks parted ways, since before they joined they all fail alike, and never a Ctrl-C, which
    every rank receives."""
    rank = launched_processes().rank
    own = in_process_group() and not isinstance(error, (FailedOnAnotherRank, KeyboardInterrupt))
    if rank == 0 or own:
        if debug:
            traceback.print_exc()
        else:
            print(f"headlab: error{f' (rank {rank})' if rank else ''}: {printable(message)}", file=sys.stderr)
    return status
