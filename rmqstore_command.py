"""The ``rmqstore`` console script's entry point, outside the package on purpose.

Importing ``rmqstore`` loads numpy and the compiled kernels, about half a second in which
a Ctrl-C would otherwise end in a traceback. The interrupt is caught here, around that
import as around the command (rmqstore.cli.main): exit status 130 and one line, as for a
command interrupted later."""
import sys


def main() -> int:
    try:
        from rmqstore.cli import main as run
        return run()
    except KeyboardInterrupt:
        if sys.stderr is not None:
            sys.stderr.write("rmqstore: interrupted\n")
        return 130
