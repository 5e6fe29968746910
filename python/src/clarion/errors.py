"""``clarion.errors`` is ``clarion_client.errors`` (the clients live in the ``clarion-client`` wheel,
which this one depends on): the same classes, so one ``except`` catches what either raises."""

from clarion_client.errors import *  # noqa: F401,F403
from clarion_client.errors import __all__  # noqa: F401
