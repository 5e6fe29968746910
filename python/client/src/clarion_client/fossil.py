"""Applies a Fossil-format delta (docs/delta.md "The format") to its base, refusing any delta
that does not produce exactly the target it describes (its size and checksum), so that a
corrupted delta or one for another base never becomes a message."""

from __future__ import annotations

_DIGITS = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~"
_VALUE = {c: i for i, c in enumerate(_DIGITS)}


class DeltaError(ValueError):
    """The delta does not apply to the base (malformed, another base, or corrupted)."""


def checksum(data: bytes) -> int:
    """The sum modulo 2**32 of ``data`` read as big-endian 32-bit words, the last one padded
    with zero bytes."""
    padded = data + b"\x00" * (-len(data) % 4)
    total = sum(int.from_bytes(padded[i : i + 4], "big") for i in range(0, len(padded), 4))
    return total & 0xFFFFFFFF


def apply(base: bytes, delta: bytes, limit: int = 64 << 20) -> bytes:
    """The target ``delta`` makes of ``base``; :class:`DeltaError` when it does not apply.
    ``limit``: the largest target accepted (checked before building it)."""
    pos = 0

    def integer() -> int:
        nonlocal pos
        start, value = pos, 0
        while pos < len(delta) and delta[pos] in _VALUE:
            value = (value << 6) | _VALUE[delta[pos]]
            pos += 1
        if pos == start or pos - start > 6 or value >= 1 << 32:
            raise DeltaError("bad integer in delta")
        return value

    def op() -> int:
        nonlocal pos
        if pos >= len(delta):
            raise DeltaError("delta ends before its terminator")
        pos += 1
        return delta[pos - 1]

    size = integer()
    if op() != ord("\n"):
        raise DeltaError("bad delta header")
    if size > limit:
        raise DeltaError(f"delta target of {size} bytes exceeds {limit}")
    out = bytearray()
    while True:
        n = integer()
        c = op()
        if c == ord("@"):
            offset = integer()
            if op() != ord(","):
                raise DeltaError("bad copy command")
            if offset + n > len(base):
                raise DeltaError("copy reads past the end of the base")
            if len(out) + n > size:
                raise DeltaError("delta writes past its declared size")
            out += base[offset : offset + n]
        elif c == ord(":"):
            if pos + n > len(delta):
                raise DeltaError("insert runs past the end of the delta")
            if len(out) + n > size:
                raise DeltaError("delta writes past its declared size")
            out += delta[pos : pos + n]
            pos += n
        elif c == ord(";"):
            if len(out) != size:
                raise DeltaError("delta output is shorter than its declared size")
            if checksum(bytes(out)) != n:
                raise DeltaError("delta checksum mismatch")
            if pos != len(delta):
                raise DeltaError("bytes after the delta terminator")
            return bytes(out)
        else:
            raise DeltaError(f"unexpected byte {c:#04x} in delta")
