"""The studio server is safe by default: a real Panel server started with the README's command, the sockets it
listens on, the session refused to a client off this machine, visitor paths confined to
the server's roots, remote agents only the server names, and device/file strings escaped in a real Chromium."""

from __future__ import annotations

import http.server
import ipaddress
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import onnx
import pytest

from gui_support import PanelServer, accepts_connections, free_port, make_small_study, wait_for_bokeh, wait_until

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = '<img src=x onerror="window.__pwned=1">'
# True when some element's text (through every shadow root, where Panel's panes live) contains the payload as text.
SHOWS_TEXT = """
(payload) => {
  const walk = (root) => {
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot && walk(el.shadowRoot)) return true;
      if (el.children.length === 0 && (el.textContent || '').includes(payload)) return true;
    }
    return false;
  };
  return walk(document);
}
"""


# ---- the server's sockets and who gets a session ---------------------------------------------------------------
def readme_studio_command() -> list[str]:
    """The studio command of the README's set-up section, as arguments."""
    text = (ROOT / "README.md").read_text()
    setup = text[text.index("## Set-up"):text.index("## The studio")]
    line = next(line for line in setup.splitlines() if "panel serve app.py" in line)
    return shlex.split(line[line.index("panel serve app.py"):])


def listening_addresses(port: int) -> set[str]:
    """The local addresses of TCP sockets listening on `port` (from /proc/net/tcp and tcp6)."""
    found = set()
    for name, width in (("tcp", 4), ("tcp6", 16)):
        path = Path("/proc/net") / name
        if not path.exists():
            continue
        for row in path.read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            address, port_hex = local.split(":")
            if state != "0A" or int(port_hex, 16) != port:  # 0A: LISTEN
                continue
            raw = bytes.fromhex(address)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, width, 4))
            found.add(str(ipaddress.ip_address(raw)))
    return found


def get(url: str, headers: dict | None = None, timeout: float = 30.0) -> str:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read().decode("utf-8", "replace")


class StudioProcess:
    """A studio server started as its user would start it, on a free port; stopped by its own pid."""

    def __init__(self, argv: list[str], port: int, path: str, open_page: bool = True):
        self.port, self.path = port, path
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        # Without open_page, nothing runs app.py before the test's first connection.
        up = self._up if open_page else (lambda: accepts_connections(port))
        wait_until(up, 120, 0.25, message=f"the studio did not start: {argv}")

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/{self.path}"

    def _up(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"the studio exited: {self.process.stdout.read()}")
        try:
            get(self.url(), timeout=5)
            return True
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def readme_studio():
    """The README's command, on a free port, behind a (pretend) proxy: the remote address the app sees is the
    X-Real-IP header's, so a client off this machine can be played from loopback."""
    command = readme_studio_command()
    assert command[:3] == ["panel", "serve", "app.py"], command
    port = free_port()
    args = command[3:]
    extra = ["--port", str(port), "--use-xheaders"]
    if "--args" in args:
        at = args.index("--args")
        args = args[:at] + extra + args[at:]
    else:
        args = args + extra
    studio = StudioProcess([sys.executable, "-m", "panel", "serve", "app.py", *args], port, "app")
    yield studio
    studio.stop()


def test_the_readmes_studio_listens_on_loopback_only(readme_studio):
    addresses = listening_addresses(readme_studio.port)
    assert addresses, "no listening socket found"
    assert addresses <= {"127.0.0.1", "::1"}, addresses


def websocket_answer(port: int, origin: str | None) -> str:
    """What a raw (non-browser) websocket client gets from the studio's /app/ws with a fresh session token:
    "ack" (a session is served), "refused NNN" (the handshake's status) or "closed"."""
    import asyncio

    from bokeh.util.token import generate_jwt_token, generate_session_id
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.iostream import StreamClosedError
    from tornado.websocket import WebSocketClosedError, websocket_connect

    token = generate_jwt_token(generate_session_id(), secret_key=None, signed=False)

    async def talk() -> str:
        request = HTTPRequest(f"ws://127.0.0.1:{port}/app/ws", headers={"Origin": origin} if origin else {})
        try:
            connection = await websocket_connect(request, subprotocols=["bokeh", token])
        except HTTPClientError as exc:
            return f"refused {exc.code}"
        except (StreamClosedError, WebSocketClosedError, OSError):
            return "closed"
        try:
            header = await asyncio.wait_for(connection.read_message(), 120)
        finally:
            connection.close()
        return "closed" if header is None else ("ack" if '"ACK"' in str(header) else f"other {header!r:.80}")

    return asyncio.run(talk())


def test_a_websocket_without_origin_is_refused_by_the_server_itself():
    """The README's server, its first connection a raw websocket (no page asked for before): refused, and every
    later one at the handshake; a browser's handshake (with its Origin) still gets a session."""
    command = readme_studio_command()
    port = free_port()
    studio = StudioProcess([sys.executable, "-m", "panel", "serve", "app.py", *command[3:], "--port", str(port)],
                           port, "app", open_page=False)
    try:
        assert websocket_answer(port, None) in ("closed", "refused 403")
        assert websocket_answer(port, None) == "refused 403"
        get(studio.url("localhost"))
        assert websocket_answer(port, None) == "refused 403"
        assert websocket_answer(port, f"http://localhost:{port}") == "ack"
        assert websocket_answer(port, "http://evil.example") == "refused 403"
    finally:
        studio.stop()


def shows_text(page, text: str, timeout_ms: int = 60000) -> bool:
    try:
        page.wait_for_function(SHOWS_TEXT, arg=text, timeout=timeout_ms)
        return True
    except Exception:  # playwright's TimeoutError
        return False


def test_a_session_is_served_to_this_machine_and_refused_to_others(readme_studio, browser):
    # The session's page reaches the browser over the websocket: a real Chromium reads what each client gets.
    for address in (None, "203.0.113.7", "2001:db8::5"):
        context = browser.new_context(extra_http_headers={"X-Real-IP": address} if address else {})
        try:
            page = context.new_page()
            page.goto(readme_studio.url())
            wait_for_bokeh(page)
            if address is None:  # from 127.0.0.1: the studio
                assert shows_text(page, "Model and data") and not shows_text(page, "serves only this machine", 500)
            else:
                assert shows_text(page, "serves only this machine"), address
                assert not shows_text(page, "Model and data", 500), address
        finally:
            context.close()


def test_sessions_reach_other_machines_only_when_shared_with_authentication():
    from mpstudio.widgets.policy import client_refusal

    for address in ("127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1"):
        assert client_refusal(address, share=False, auth="") == ""
    for address in ("10.1.2.3", "2001:db8::1", None, "", "not-an-address"):
        assert "only this machine" in client_refusal(address, share=False, auth="basic auth")
        assert "without authentication" in client_refusal(address, share=True, auth="")
    assert client_refusal("10.1.2.3", share=True, auth="basic auth") == ""


# ---- paths a visitor types ---------------------------------------------------------------------------------------
@pytest.fixture
def confined_state(tmp_path, conv_model_path):
    """A served studio's state whose only root is `tmp_path / 'root'`, a model and data outside it."""
    from mpstudio.widgets import ModelPanel, StudioState
    from mpstudio.widgets.policy import ServerPolicy

    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    model = outside / "secret.onnx"
    model.write_bytes(conv_model_path.read_bytes())
    (root / "link").symlink_to(outside)
    state = StudioState(policy=ServerPolicy.served(roots=[root]), auto_analyze=False)
    yield state, ModelPanel(state=state), root, outside
    state.close()


def _refusal(state, panel, handler, **fields) -> str:
    with __import__("param").edit_constant(state):
        state.error = ""
    state.param.update(**fields)
    getattr(panel, handler)(None)
    return state.error


def test_paths_outside_the_roots_are_refused_without_saying_whether_they_exist(confined_state):
    state, panel, root, outside = confined_state
    jobs = len(state.jobs)
    refusals = {}
    for name, model in (("exists", outside / "secret.onnx"), ("missing", outside / "missing.onnx"),
                        ("through a link", root / "link" / "secret.onnx"), ("climbing", "../outside/secret.onnx"),
                        ("system", "/etc/passwd"), ("home", "~/x.onnx")):
        error = _refusal(state, panel, "_on_open_model", model_path=str(model), data_path=str(root))
        assert "is not under the folders this studio may open" in error, (name, error)
        refusals[name] = error.replace(repr(str(model)), "PATH")
    assert len(set(refusals.values())) == 1, refusals  # the same words whatever the path: no oracle
    error = _refusal(state, panel, "_on_open_model", model_path=str(root / "m.onnx"), data_path=str(outside))
    assert "data folder" in error and "not under the folders" in error
    for folder in (outside, outside / "missing", root / "link"):
        error = _refusal(state, panel, "_on_open_study", study_path=str(folder))
        assert "study folder" in error and "not under the folders" in error
    assert len(state.jobs) == jobs  # nothing was opened, nothing was read


def test_paths_under_the_roots_are_opened(confined_state):
    state, panel, root, outside = confined_state
    _refusal(state, panel, "_on_open_model", model_path="missing.onnx", data_path=".")
    job = state.jobs[0]
    wait_until(lambda: not job.active, 60)
    assert "model file not found" in state.error and str(root / "missing.onnx") in state.error


def _opened(state, panel, **fields) -> str:
    """Open what the fields name as a visitor would; the error the opening ended with ("" when it opened)."""
    jobs = len(state.jobs)
    error = _refusal(state, panel, "_on_open_model", **fields)
    if len(state.jobs) > jobs:
        job = state.jobs[0]  # the newest
        wait_until(lambda: not job.active, 300)
    return state.error


def test_links_inside_the_roots_to_files_outside_are_not_followed(confined_state, conv_model_path):
    """A sample in a confined data folder, or a model's external data file, that is a link to a file outside
    the roots is refused, not read; the same files really under the roots open."""
    import numpy as np

    state, panel, root, outside = confined_state
    feed = {"x": np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    data = root / "data"
    data.mkdir()
    np.savez(data / "a.npz", **feed)
    np.savez(outside / "b.npz", **feed)
    (data / "b.npz").symlink_to(outside / "b.npz")
    model = root / "model.onnx"
    model.write_bytes(conv_model_path.read_bytes())
    error = _opened(state, panel, model_path=str(model), data_path=str(data))
    assert "data file" in error and "b.npz" in error and "not under the folders" in error, error
    assert state.study is None

    (data / "b.npz").unlink()
    external = root / "external"
    external.mkdir()
    onnx.save(onnx.load(conv_model_path), external / "model.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    (external / "weights.bin").rename(outside / "weights.bin")
    (external / "weights.bin").symlink_to(outside / "weights.bin")
    error = _opened(state, panel, model_path=str(external / "model.onnx"), data_path=str(data))
    assert "external data file" in error and "not under the folders" in error, error
    assert state.study is None

    (external / "weights.bin").unlink()
    (outside / "weights.bin").rename(external / "weights.bin")
    assert _opened(state, panel, model_path=str(external / "model.onnx"), data_path=str(data)) == ""
    assert state.study is not None


def test_the_export_folder_is_confined_to_the_roots(tmp_path):
    from mpstudio.errors import MpstudioError
    from mpstudio.widgets.policy import ServerPolicy

    policy = ServerPolicy.served(roots=[tmp_path])
    assert policy.confine("exports", "export folder") == str(tmp_path / "exports")
    with pytest.raises(MpstudioError, match="export folder .* not under the folders"):
        policy.confine("/tmp/../etc", "export folder")


# ---- remote agents ------------------------------------------------------------------------------------------------
class CountingServer:
    """An HTTP server on loopback that counts what reaches it (a stand-in for an agent nobody named)."""

    def __init__(self):
        self.requests = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                self.send_response(404)
                self.end_headers()

            do_POST = do_PUT = do_GET

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_visitor_cannot_send_work_to_an_agent_the_server_did_not_name():
    import panel as pn

    from mpstudio.errors import MpstudioError
    from mpstudio.widgets import RunPanel, StudioState
    from mpstudio.widgets.policy import ServerPolicy
    from mpstudio.widgets.serving import policy_from, studio_parser

    named = "http://127.0.0.1:9/named-agent"
    stranger = CountingServer()
    try:
        policy = policy_from(studio_parser().parse_args(["--agent", named]))
        state = StudioState(policy=policy, auto_analyze=False)
        assert state.agent_url == named
        panel = RunPanel(state=state)
        layout = panel.__panel__()
        texts = [w for w in layout.select(pn.widgets.TextInput) if w.name == "Agent URL"]
        choices = [w for w in layout.select(pn.widgets.Select) if w.name == "Agent"]
        assert not texts and [c.options for c in choices] == [[named]]
        state.runner = "remote"
        state.agent_url = stranger.url  # what a hostile websocket client could set
        with pytest.raises(MpstudioError, match="only on the agents its server names"):
            state.runner_client()
        state.agent_url = named
        assert state.runner_client().url.rstrip("/") == named
        nobody = StudioState(policy=ServerPolicy.served(), auto_analyze=False)
        nobody.runner, nobody.agent_url = "remote", stranger.url
        with pytest.raises(MpstudioError, match="names no remote agent"):
            nobody.runner_client()
        time.sleep(0.2)
        assert stranger.requests == []
        state.close()
        nobody.close()
    finally:
        stranger.close()


# ---- strings from devices and files reach HTML as text ------------------------------------------------------------
@pytest.fixture(scope="module")
def hostile_study(tmp_path_factory):
    """A study whose measured latency names a hostile device and whose estimate a hostile calibration device."""
    from mpstudio.plan import PrecisionPlan
    from mpstudio.sources import Latency

    study = make_small_study(tmp_path_factory.mktemp("xss") / "study", analyzed=False)
    a8w8, a16w8 = study.plan_id(PrecisionPlan.a8w8()), study.plan_id(PrecisionPlan.a16w8())
    study.store.record_latency(a8w8, Latency(ms=1.0, source="measured", where=PAYLOAD))
    study.store.record_latency(a16w8, Latency(ms=2.0, source="measured", where="device-2"))
    study.store.record_latency(a16w8, Latency(ms=2.0, source="estimate",
                                              where=f"HTP v{study.htp_arch} (cost model, calibrated on {PAYLOAD})"))
    return study


def test_device_names_and_calibrations_are_shown_as_text_not_markup(hostile_study, page):
    from mpstudio.widgets import ParetoPlot, StudioState

    states = []

    def session():
        state = StudioState(hostile_study, auto_analyze=False, latency_source="measured")
        states.append(state)
        return ParetoPlot(state=state)

    server = PanelServer(session)
    try:
        page.goto(server.url)
        wait_for_bokeh(page)
        for source in ("measured", "estimate"):
            if source == "estimate":
                page.get_by_role("button", name="estimate").click()
            assert shows_text(page, "on the front"), source  # the note above the plot is drawn
            time.sleep(0.5)  # an image's error handler, had one been made, fires at once
            assert page.evaluate("() => window.__pwned") is None, f"a {source} label ran script"
            assert shows_text(page, PAYLOAD, 5000), source  # the label is there, as text
    finally:
        for state in states:
            state.close()
        server.stop()
