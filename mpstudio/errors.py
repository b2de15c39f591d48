"""The one exception type for errors a user can cause (bad model, data, plan, option, agent)."""


class MpstudioError(Exception):
    """Something the user gave is wrong; the message says what and what to do about it."""


def brief(exc: BaseException, limit: int = 400) -> str:
    """An exception from deep inside ONNX or ORT as one line of at most `limit` characters, for a message."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:limit] + ("..." if len(text) > limit else "")
