"""Appendable messages (AI token streams, docs/protocol.md "Appendable messages") as a
subscriber sees them: the fold rule that turns ``append`` events and a resume's folded message
into the text so far of each stream, each change yielded to the app as a :class:`StreamText`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Union


@dataclass(frozen=True)
class StreamText:
    """The text so far of an appendable message: ``seq`` fragments of stream ``stream``,
    ``done`` once it is closed (``reason`` ``"timeout"`` when the server closed it,
    ``"restart"`` when a restart with ``history_dir`` did)."""

    topic: str
    id: str
    stream: str
    text: str
    seq: int
    done: bool = False
    reason: Optional[str] = None


#: What :meth:`StreamFold.take` found: a new text, nothing new, or fragments missing.
MISSING = "missing"


class StreamFold:
    """Per stream, the text and ``seq`` held. A folded message (``type`` ``message`` with a
    ``stream``) replaces them when its ``seq`` is larger; an ``append`` at or below the ``seq``
    held is dropped, the next one is added, a later one means fragments are missing."""

    def __init__(self) -> None:
        self._held: Dict[str, Tuple[str, int]] = {}

    def take(self, m: Dict[str, Any]) -> Union[StreamText, None, str]:
        stream, seq, data = str(m.get("stream")), m.get("seq"), str(m.get("data", ""))
        if not isinstance(seq, int):
            return MISSING
        text, held = self._held.get(stream, ("", 0))
        if seq <= held:
            return None
        if m.get("type") == "append":
            if seq != held + 1:
                return MISSING
            text += data
        else:
            text = data
        done = bool(m.get("done"))
        self._held[stream] = (text, seq)
        return StreamText(str(m.get("topic")), str(m.get("id")), stream, text, seq, done, m.get("reason"))
