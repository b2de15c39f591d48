"""What a served studio lets its visitors do: who may have a session (loopback clients, unless sharing was chosen
and Panel's authentication is on), which folders a typed path may name (the server's roots, the working directory
by default), which remote agents a visitor may send work to (the ones the server names)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

import panel as pn

from ..agent.protocol import TOKEN_ENV
from ..errors import MpstudioError

ROOTS_ENV = "MPSTUDIO_STUDIO_ROOTS"  # os.pathsep-separated folders, used when no --root is given
AGENTS_ENV = "MPSTUDIO_STUDIO_AGENTS"  # whitespace-separated agent URLs, used when no --agent is given


@dataclass(frozen=True)
class ServerPolicy:
    """What a served studio lets its visitors do. `roots`: folders a typed path may name (None: any, as in a
    notebook, where the user owns the process); `agents`: remote agent URLs a visitor may choose (None: any
    URL); `agent_token`: the token sent to them; `share`: serve clients from other machines (with Panel's
    authentication only)."""

    roots: tuple[Path, ...] | None = None
    agents: tuple[str, ...] | None = None
    agent_token: str = field(default="", repr=False)
    share: bool = False

    @classmethod
    def served(cls, roots=(), agents=(), agent_token: str = "", share: bool = False) -> "ServerPolicy":
        """The policy of a served studio: the roots given (else $MPSTUDIO_STUDIO_ROOTS, else the working
        directory), the agents given (else $MPSTUDIO_STUDIO_AGENTS, else none)."""
        roots = list(roots) or [r for r in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if r.strip()] or ["."]
        resolved = []
        for root in roots:
            path = Path(root).expanduser().resolve()
            if not path.is_dir():
                raise MpstudioError(f"--root {root}: not a folder; give folders the studio may open files in")
            resolved.append(path)
        agents = list(agents) or os.environ.get(AGENTS_ENV, "").split()
        for url in agents:
            if not url.startswith(("http://", "https://")):
                raise MpstudioError(f"--agent {url}: give an agent's URL, such as http://192.168.1.20:8765")
        return cls(roots=tuple(resolved), agents=tuple(u.rstrip("/") for u in agents),
                   agent_token=agent_token or os.environ.get(TOKEN_ENV, ""), share=share)

    def confine(self, text, what: str) -> str:
        """The path a visitor typed, resolved, if it lies under a root; else MpstudioError. The refusal is the
        same whether or not the path exists, so it tells nothing about the server's files outside the roots.
        Without roots, or for an empty field (the caller asks for it), `text` as it is."""
        text = str(text or "").strip()
        if not text or self.roots is None:
            return text
        try:
            path = Path(text).expanduser()
            path = (path if path.is_absolute() else self.roots[0] / path).resolve()
        except (OSError, RuntimeError):  # an unknown ~user, a symlink loop: refused like any path outside
            path = None
        if path is None or not any(path == root or path.is_relative_to(root) for root in self.roots):
            raise MpstudioError(f"the {what} {text!r} is not under the folders this studio may open "
                                f"({', '.join(str(r) for r in self.roots)}); move it there, or restart the "
                                f"studio with --root naming its folder")
        return str(path)

    def agent(self, url: str) -> str:
        """`url`, if a visitor may send work there; else MpstudioError (nothing is sent)."""
        url = str(url or "").strip().rstrip("/")
        if self.agents is None:
            return url
        if not self.agents:
            raise MpstudioError("this studio names no remote agent; restart it with --agent URL (one per agent) "
                                "to run plans on one")
        if url not in self.agents:
            raise MpstudioError(f"this studio runs plans only on the agents its server names: "
                                f"{', '.join(self.agents)}")
        return url


# ---- who may open a session ---------------------------------------------------------------------------------
def is_loopback(address: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback addresses."""
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def authentication() -> str:
    """Panel's authentication this server runs with ('' when none): basic auth or an OAuth provider."""
    if pn.config.basic_auth:
        return "basic auth"
    if pn.config.oauth_provider:
        return f"OAuth ({pn.config.oauth_provider})"
    return ""


def client_refusal(address: str | None, share: bool, auth: str) -> str:
    """Why a client at `address` gets no session ('' when it does): clients off this machine are served only
    when sharing was chosen and Panel's authentication is on."""
    if is_loopback(address):
        return ""
    if not share:
        return ("This studio serves only this machine. To share it, restart it with --share and Panel's "
                "authentication (--basic-auth or OAuth) and --allow-websocket-origin; see docs/security.md.")
    if not auth:
        return ("This studio was started with --share but without authentication; restart it with --basic-auth "
                "or OAuth (see docs/security.md).")
    return ""


def session_address() -> str | None:
    """The remote address of the client whose session is being made (None outside a served session)."""
    context = getattr(pn.state.curdoc, "session_context", None)
    request = getattr(context, "request", None) if context is not None else None
    return getattr(request, "remote_ip", None) if request is not None else None
