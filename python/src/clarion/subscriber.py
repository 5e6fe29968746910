"""``clarion.subscriber`` is ``clarion_client.subscriber`` (the clients live in the ``clarion-client`` wheel,
which this one depends on): the same classes, so one ``except`` catches what either raises."""

from clarion_client.subscriber import *  # noqa: F401,F403
from clarion_client.subscriber import __all__  # noqa: F401
