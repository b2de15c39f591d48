"""The studio writes its constant parameters from many threads at once (job lanes, sessions, notebooks): no write
may find the flag set again by another thread's block ending."""

from __future__ import annotations

import threading

import param
import pytest

from mpstudio.widgets.constants import writable


class Fields(param.Parameterized):
    value = param.Integer(0, constant=True)
    text = param.String("", constant=True)


def _overlapping_blocks(edit) -> list[BaseException]:
    """Two threads, each writing its own instance inside `edit(obj)`: the first opens its block, the second opens
    its own, the first closes, then the second writes. The errors raised."""
    first, second = Fields(), Fields()
    opened, closed = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def first_thread():
        with edit(first):
            first.value = 1
            opened.set()
            closed.wait(10)  # then ends its block while the second is open

    def second_thread():
        assert opened.wait(10)
        try:
            with edit(second):
                closed.set()
                worker.join(10)  # the first thread's block has ended
                second.value = 2
                second.text = "two"
        except BaseException as exc:  # noqa: BLE001 - what the race raises is the finding
            errors.append(exc)

    worker = threading.Thread(target=first_thread)
    other = threading.Thread(target=second_thread)
    worker.start()
    other.start()
    other.join(20)
    return errors


def test_params_own_edit_constant_fails_when_blocks_overlap_across_threads():
    # The failure this module exists for, on the installed param.
    errors = _overlapping_blocks(param.edit_constant)
    assert errors and "Constant parameter" in str(errors[0])


def test_overlapping_blocks_in_two_threads_both_write():
    assert _overlapping_blocks(writable) == []


def test_the_flags_are_restored_when_the_last_block_closes():
    obj, other = Fields(), Fields()
    with writable(obj):
        with writable(other):
            other.value = 2
        obj.value = 1  # still open for obj although other's block closed
    assert (obj.value, other.value) == (1, 2)
    with pytest.raises(TypeError, match="Constant parameter"):
        obj.value = 3
    with pytest.raises(TypeError, match="Constant parameter"):
        other.text = "x"
    # An instance copy of a parameter made inside a block is constant again afterwards.
    with writable(obj):
        obj.param["value"].bounds = (0, 10)  # param copies the parameter onto the instance
        obj.value = 4
    with pytest.raises(TypeError, match="Constant parameter"):
        obj.value = 5
