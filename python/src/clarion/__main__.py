"""``python -m clarion ARGS``: runs the server binary with ARGS, as the ``clarion`` command does.

The process is replaced by the binary (``exec``), so signals, the exit status and the standard
streams are the binary's own: ``python -m clarion serve`` stops on Ctrl-C or SIGTERM exactly as
``clarion serve`` does.
"""

import os
import sys

from ._find import find_clarion_bin


def main() -> None:
    """Replaces this process with the ``clarion`` binary, passing the arguments through."""
    binary = find_clarion_bin()
    os.execv(binary, [binary, *sys.argv[1:]])


if __name__ == "__main__":
    main()
