"""The pytest plugin, registered by the wheel's ``pytest11`` entry point.

Fixtures:

- ``clarion_server``: one :class:`clarion.testing.ClarionServer` for the whole session, started
  on free loopback ports and stopped at the end. Use distinct topics per test.
- ``clarion_server_args``: the extra ``clarion serve`` flags for it; override it in a
  ``conftest.py`` (session scope) to configure the server, e.g. ``["--api-key", "secret"]``.
- ``clarion_client``: a :class:`clarion.Client` for that server, closed after the test.

Disable the plugin with ``-p no:clarion``.
"""

from typing import TYPE_CHECKING, Iterator, List

import pytest

if TYPE_CHECKING:
    from .client import Client
    from .testing import ClarionServer

# The plugin is loaded by every pytest run in an environment that has clarion installed, so the
# server helper and httpx are imported only when a fixture is used.


@pytest.fixture(scope="session")
def clarion_server_args() -> List[str]:
    """Extra ``clarion serve`` flags for ``clarion_server`` (none by default)."""
    return []


@pytest.fixture(scope="session")
def clarion_server(clarion_server_args: List[str]) -> Iterator["ClarionServer"]:
    """A Clarion server for the test session, on free loopback ports."""
    from .testing import ClarionServer

    with ClarionServer(clarion_server_args) as server:
        yield server


@pytest.fixture
def clarion_client(clarion_server: "ClarionServer") -> Iterator["Client"]:
    """A publish client for ``clarion_server``."""
    with clarion_server.client() as client:
        yield client
