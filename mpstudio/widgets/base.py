"""What every view shares: its layout is built on first display and reused after."""

from __future__ import annotations

import functools
import os
import time
from weakref import WeakKeyDictionary

import panel as pn


def laid_out_once(method):
    """Wrap a view's `__panel__` so that displaying the view again (a notebook cell run twice, a template)
    reuses one layout instead of making panes whose watchers outlive them."""
    @functools.wraps(method)
    def wrapper(self):
        view = self.__dict__.get("_laid_out")
        if view is None:
            view = self.__dict__["_laid_out"] = method(self)
        return view
    return wrapper


def shows_errors(handler):
    """Wrap a view's `_on_*` handler: a user error becomes the studio's error message, not a traceback in
    the server log."""
    from ..errors import MpstudioError

    @functools.wraps(handler)
    def wrapper(self, *args, **kwargs):
        try:
            return handler(self, *args, **kwargs)
        except MpstudioError as exc:
            self.state.show_error(str(exc))
    return wrapper


def save_inline(view, filename, resources="inline", **kwargs):
    """`view.save(filename)` with BokehJS, Panel's scripts and its models' stylesheets inlined: Panel's default
    loads them from a CDN, which leaves the page blank (or its table unreadable) offline."""
    from bokeh.resources import INLINE

    inline = resources == "inline"
    if inline:
        resources = INLINE
    # A design set for the whole process (a template or an extension call elsewhere) would add its script modules,
    # named by CDN address, to a page that does not use it: a saved view carries Panel's default design.
    design = _process_config("design")
    try:
        _process_config("design", None)
        saved = pn.panel(view).save(filename, resources=resources, **kwargs)
    finally:
        _process_config("design", design)
    if inline and isinstance(filename, (str, os.PathLike)):
        from .offline_page import make_offline

        make_offline(filename)  # and the stylesheets Panel's models import from its CDN
    return saved


def _process_config(name: str, *value):
    """Panel's process-wide setting `name` (set to `value[0]` when given). `pn.config.<name>` reads and writes the
    current session's copy, and which session is current is Bokeh's process-wide record: while a served session
    renders its page in another thread, a script's `pn.config.design = None` lands in that session instead."""
    config = pn.config
    if value:
        super(type(config), config).__setattr__(name, value[0])
        return value[0]
    return super(type(config), config).__getattribute__(name)


# How often (ms) an update waiting for the page to take its session in asks again, and for how long (s) at most
# once the page has connected: a page that never says it is ready still gets its updates (as Panel would send them).
# Rendering the studio takes seconds, and many more on a loaded machine: the bound is far above it.
READY_POLL_MS = 100
READY_WAIT_S = 60.0

_first_connected: WeakKeyDictionary = WeakKeyDictionary()  # document -> when a wait first saw its page connected


def page_not_ready(doc, bounded: bool = True) -> bool:
    """Whether `doc` is served, its page has connected, and it has not yet said it has rendered the session
    (Bokeh's document_ready, which Panel records). Until then Panel drops the changes a hold collects, taking them
    for changes the document the page pulls carries; but once connected the page may have pulled it already, and
    an update made then never reaches it (a new row's progress then names a model the page never got: "reference
    ... isn't known"; the graph opens grey, or without the selection just made). So the studio's batched updates
    wait for it, at most READY_WAIT_S from when a wait first saw the page connected (`bounded`). Before the page
    connects nothing waits: the document it will pull carries the change. False when not served, or when the
    Panel in use keeps no record."""
    from panel.io.state import state

    from .closed_tabs import open_connections

    ready = getattr(state, "_connected", None)
    if doc is None or doc.session_context is None or ready is None or ready.get(doc):
        return False
    if open_connections(doc) == 0:
        return False
    if not bounded:
        return True
    first = _first_connected.setdefault(doc, time.monotonic())
    return time.monotonic() - first <= READY_WAIT_S


def _in(doc, callback, *args):
    from panel.io.state import set_curdoc

    if doc is None:
        return callback(*args)
    with set_curdoc(doc):
        return callback(*args)


def in_document(doc, callback):
    """`callback` run with `doc` as Panel's current document (its own, per thread). Bokeh runs a model's Python
    callbacks and next-tick callbacks with its process-wide current document, which another server in the process
    (a thread) changes while it applies a message of its own; Panel reads it to decide whether a pane updates now
    and to pick the document's cached stylesheets, so a pane updated then took a stylesheet of another document
    and the server failed the page's message ("Models must be owned by only a single document")."""
    return functools.wraps(callback)(functools.partial(_in, doc, callback))


def on_model_change(model, attrs, callback) -> None:
    """`model.on_change(attr, callback)` for each of `attrs`, run in `model`'s document (`in_document`; the
    document is read at each call: the model joins one after this)."""
    def run(attr, old, new):
        return _in(model.document, callback, attr, old, new)
    for attr in [attrs] if isinstance(attrs, str) else attrs:
        model.on_change(attr, run)


def on_document_thread(model, update, *, next_tick: bool = False) -> None:
    """Run `update`, which changes Bokeh models of `model`'s document, where Bokeh allows it: now, unless the
    document is served and this thread is not its session's (a script or a notebook driving a served studio from
    its own thread); then on the session's event loop, under the document's lock and in one batch. (Bokeh refuses a
    change made elsewhere, or sends it to the page racing the session's own messages.) `next_tick`: a served
    document is changed in a next-tick callback even from its own thread (a widget callback, which Panel runs on
    the event loop without the document's lock)."""
    doc = model.document
    if doc is None or doc.session_context is None or (not next_tick and pn.state._unblocked(doc)):
        update()
        return

    def run():
        if page_not_ready(doc):
            doc.add_timeout_callback(scheduled, READY_POLL_MS)
            return
        with pn.io.hold(doc):
            update()
    scheduled = in_document(doc, run)
    try:
        doc.add_next_tick_callback(scheduled)
    except Exception:  # the session ended: nothing left to draw
        pass


class View(pn.viewable.Viewer):
    """A studio view: its static save renders offline."""

    def save(self, filename, resources="inline", **kwargs):
        return save_inline(self, filename, resources=resources, **kwargs)
