"""Arrays to and from .npz for the routes: small ones on the event loop, larger ones in a thread."""

from __future__ import annotations

import numpy as np
from starlette.concurrency import run_in_threadpool

from ..protocol import decode_npz, encode_npz, npz_declared_bytes

# Arrays up to this size are (de)coded on the event loop: well under a millisecond, less than a thread hop.
INLINE_BYTES = 1 << 20


async def decoded(data: bytes, limit: int, members=None) -> dict:
    """The arrays of an .npz (those `members` accepts), refused past `limit` bytes before any decompression;
    decoded off the event loop unless they are small (two thread hand-offs would cost more than decoding a
    few arrays)."""
    if len(data) <= INLINE_BYTES and npz_declared_bytes(data) <= INLINE_BYTES:
        return decode_npz(data, limit, members)
    return await run_in_threadpool(decode_npz, data, limit, members)


async def encoded(arrays: dict) -> bytes:
    """The .npz of `arrays`, encoded off the event loop unless they are small."""
    if sum(np.asarray(a).nbytes for a in arrays.values()) <= INLINE_BYTES:
        return encode_npz(arrays)
    return await run_in_threadpool(encode_npz, arrays)
