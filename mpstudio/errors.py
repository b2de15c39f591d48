"""The one exception type for errors a user can cause (bad model, data, plan, option, agent)."""


class MpstudioError(Exception):
    """Something the user gave is wrong; the message says what and what to do about it."""
