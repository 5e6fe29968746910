"""``clarion.client`` is ``clarion_client.client`` (the clients live in the ``clarion-client`` wheel,
which this one depends on): the same classes, so one ``except`` catches what either raises."""

from clarion_client.client import *  # noqa: F401,F403
from clarion_client.client import __all__  # noqa: F401
