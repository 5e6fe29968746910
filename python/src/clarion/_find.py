"""Where the ``clarion`` binary is: the override variable, else the wheel's scripts directory."""

import os
import sys
import sysconfig

#: Environment variable naming a ``clarion`` binary to use instead of the wheel's (the same
#: name as the npm launcher's override).
BINARY_PATH_VARIABLE = "CLARION_BINARY_PATH"


def find_clarion_bin() -> str:
    """Returns the path of the ``clarion`` binary this package runs.

    ``$CLARION_BINARY_PATH`` wins when set. Otherwise the binary is where pip put the wheel's
    script: the scripts directory of this interpreter's installation scheme (a virtualenv's
    ``bin/``), or of the user scheme for ``pip install --user``.

    Raises:
        FileNotFoundError: the variable names a missing file, or no installed binary was found
            (for example when the package is imported from a source checkout).
    """
    override = os.environ.get(BINARY_PATH_VARIABLE)
    if override:
        if not os.path.isfile(override):
            raise FileNotFoundError(f"{BINARY_PATH_VARIABLE}={override} is not a file")
        return override
    name = "clarion" + (sysconfig.get_config_var("EXE") or "")
    candidates = [sysconfig.get_path("scripts")]
    user_scheme = f"{os.name}_user"
    if user_scheme in sysconfig.get_scheme_names():
        candidates.append(sysconfig.get_path("scripts", scheme=user_scheme))
    # `pip install --target DIR` puts scripts in DIR/bin next to the package.
    candidates.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "bin"))
    for directory in candidates:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"the clarion binary is not installed next to this Python ({sys.executable}); "
        f"looked in {', '.join(candidates)}. Install the wheel (pip install clarion) or set "
        f"{BINARY_PATH_VARIABLE} to a clarion binary."
    )
