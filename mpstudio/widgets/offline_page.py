"""A saved studio page that renders offline: the stylesheets Panel's models import by URL (its CDN, or the
server's static path) put inline in the page, read from the installed Panel's own files.

Bokeh's inline resources put BokehJS and Panel's scripts in the page, but each Panel model still names its
stylesheets as `ImportedStyleSheet` URLs; offline, those fail and the ranking table is unreadable.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

_IMPORTED = re.compile(r'\{"type":"object","name":"ImportedStyleSheet","id":"(?P<id>[^"]+)",'
                       r'"attributes":\{"url":"(?P<url>[^"]+)"\}\}')
# Panel's files under its dist folder, as its CDN and a server's static route name them.
_PANEL_URL = re.compile(r"^(?:https?://cdn\.holoviz\.org/panel/[^/]+/dist/|(?:\./)?static/extensions/panel/)"
                        r"(?P<path>[^?#]+)")
_ICON_LINK = re.compile(r'<link rel="(?:apple-touch-icon|icon)"[^>]*href="https?://[^"]*"[^>]*>')


def panel_file(url: str) -> Path | None:
    """The installed Panel's copy of the file `url` names, or None (another site's file, or not installed)."""
    import panel

    match = _PANEL_URL.match(url)
    if match is None:
        return None
    dist = (Path(panel.__file__).parent / "dist").resolve()
    path = (dist / match["path"]).resolve()
    return path if path.is_file() and path.is_relative_to(dist) else None


@lru_cache(maxsize=64)
def _css(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def inline_stylesheets(page: str) -> str:
    """`page` (a saved Bokeh/Panel document) with every stylesheet of Panel's that its models import by URL
    inlined, and the CDN's favicon links dropped; stylesheets of other sites are left as they are."""
    def inline(match: re.Match) -> str:
        path = panel_file(match["url"])
        if path is None:
            return match[0]
        # JSON inside a <script> element: "</" would end the element, and "<\/" is the same JSON string.
        css = json.dumps(_css(path)).replace("</", "<\\/")
        return f'{{"type":"object","name":"InlineStyleSheet","id":"{match["id"]}","attributes":{{"css":{css}}}}}'

    return _ICON_LINK.sub("", _IMPORTED.sub(inline, page))


_MODULE_SCRIPT = re.compile(r'<script type="module" src="(?P<url>https?://[^"]+)"></script>\s*')


def unused_module_scripts(page: str) -> str:
    """`page` without the script modules of Bokeh models it does not contain. Panel's page lists the modules of
    every model class the process has loaded (importing `panel.models.vizzu` anywhere adds Vizzu's, from a CDN),
    whether or not the page uses it; offline, each is a failed request."""
    from bokeh.model import Model

    owners: dict[str, set[str]] = {}
    for name, cls in Model.model_class_reverse_map.items():
        for url in getattr(cls, "__javascript_modules__", None) or ():
            owners.setdefault(url, set()).add(name)

    def keep(match) -> str:
        names = owners.get(match["url"])
        used = names is None or any(f'"name":"{name}"' in page for name in names)
        return match.group(0) if used else ""
    return _MODULE_SCRIPT.sub(keep, page)


def _design_files() -> frozenset[str]:
    """The addresses of every file a Panel design (Fast, Material, Bootstrap) adds to a page: scripts, script
    modules and its fonts' stylesheets."""
    from panel.theme.base import Design

    classes, seen = [Design], []
    while classes:  # every subclass, including those that share a name (the studio's own Fast is named as Panel's)
        cls = classes.pop()
        seen.append(cls)
        classes.extend(cls.__subclasses__())
    urls: set[str] = set()
    for cls in seen:
        try:
            resources = cls().resolve_resources(cdn=True, include_theme=False)
        except Exception:  # a design another package defines, which cannot be resolved here: nothing to drop
            continue
        for kind in ("js", "js_modules", "css"):
            urls.update(str(url) for url in resources.get(kind, {}).values())
    return frozenset(urls)


_DESIGN_TAG = re.compile(r'<script[^>]*\ssrc="(?P<src>https?://[^"]+)"[^>]*></script>\s*'
                         r'|<link[^>]*\shref="(?P<href>https?://[^"]+)"[^>]*>\s*')


def without_design_files(page: str) -> str:
    """`page`, saved with no design, without the files of a design another thread set for the whole process
    while it was saved (Panel's configuration is shared by the threads of a process: a served template sets its
    design while it renders a session's page)."""
    files = _design_files()

    def keep(match) -> str:
        return "" if (match["src"] or match["href"]) in files else match.group(0)
    return _DESIGN_TAG.sub(keep, page)


def make_offline(filename) -> None:
    """Rewrite the saved page `filename` in place so it renders without a network."""
    path = Path(filename)
    page = without_design_files(unused_module_scripts(path.read_text(encoding="utf-8")))
    path.write_text(inline_stylesheets(page), encoding="utf-8")
