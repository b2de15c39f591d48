"""SearchCard: a search's answer as a card the user can read: the recommended plan and why it was picked, the
plans scored on the CPU and on the HTP side by side, where the two disagree, and the alternatives worth a look."""

from __future__ import annotations

import html
import math
from types import SimpleNamespace

import panel as pn
import param

from ..search.recommend import LITTLE_MORE, MUCH_BETTER, estimate_ms
from ..value_text import value_text
from .base import View, laid_out_once
from .state import StudioState

# Figures and headers on one line each (the card breaks long words anywhere: "0.16|37" would read as two numbers);
# names and reasons wrap.
_CELL = "padding:2px 8px;border-bottom:1px solid #e3e8ee;text-align:right;white-space:nowrap"
_HEAD = "padding:2px 8px;border-bottom:1px solid #9aa0a6;text-align:right;font-weight:600;white-space:nowrap"
_TEXT = "padding:2px 8px;border-bottom:1px solid #e3e8ee;text-align:left;white-space:normal;overflow-wrap:normal"


def _ms(value: float) -> str:
    return f"{value:.3f} ms" if math.isfinite(value) else "-"


def _why(result) -> str:
    """Why this plan: the rule the search applied, in words."""
    r = result.recommended
    op = ">=" if result.higher_is_better else "<="
    target = f"{html.escape(result.metric)} {op} {value_text(result.threshold)} ({html.escape(result.target)})"
    if result.within_noise:
        return (f"No stored plan clearly reaches {target}: this one is within noise of it (the difference is less "
                "than one step of the metric, or inside its 95 % interval), so it is neither clearly reached nor "
                f"clearly missed. {html.escape(result.choice)}.")
    if not result.reached:
        return (f"No evaluated plan reaches {target}; this is the closest (no evaluated plan is more accurate), "
                f"{value_text(result.misses_by)} short.")
    where = f" on {html.escape(r.accuracy_source)}" if result.confirmed else ""
    text = (f"The cheapest plan by estimated latency that reaches {target}{where}, "
            f"{value_text(result.gap)} better than needed.")
    if result.walk_pick is not None:
        w = result.walk_pick
        text += (f" The walk on {html.escape(w.accuracy_source)} picked plan {w.plan_id} {html.escape(w.name)} "
                 f"({value_text(w.value)} there); the HTP's numbers changed the pick.")
    ratio = result.latency_ratio()
    if ratio is not None:
        text += f" Its estimated latency is {ratio:.2f}x a16w8's."
    return text


def _confirmation_table(result) -> str:
    if not result.confirmations:
        note = html.escape(result.confirm_note) if result.confirm_note else \
            "The search scored plans on one backend only (no confirmation was asked for)."
        return f"<p style='color:#555'>{note}</p>"
    first = result.confirmations[0]
    walk, confirmed = html.escape(first.walk.accuracy_source), html.escape(first.confirmed.accuracy_source)
    rows = []
    for c in sorted(result.confirmations, key=lambda c: estimate_ms(c.walk)):
        cells = []
        for e, verdict in zip((c.walk, c.confirmed), c.verdicts(result.threshold, result.higher_is_better)):
            colour = {"reaches": "#1a7f37", "misses": "#b42318"}.get(verdict, "#9a6700")
            cells.append(f"<td style='{_CELL}'>{value_text(e.value)} "
                         f"<span style='color:{colour}'>{verdict}</span></td>")
        mark = " style='background:#fff4d6'" if c.walk.plan_id == result.recommended.plan_id else ""
        rows.append(f"<tr{mark}><td style='{_CELL}'>{c.walk.plan_id}</td><td style='{_CELL};text-align:left'>"
                    f"{html.escape(c.walk.name)}</td>{''.join(cells)}<td style='{_CELL}'>"
                    f"{_ms(estimate_ms(c.walk))}</td></tr>")
    return (f"<table style='border-collapse:collapse;font-size:12px;margin:4px 0'><tr><th style='{_HEAD}'>plan</th>"
            f"<th style='{_HEAD};text-align:left'>name</th><th style='{_HEAD}'>{walk}</th>"
            f"<th style='{_HEAD}'>{confirmed}</th><th style='{_HEAD}'>estimate</th></tr>{''.join(rows)}</table>"
            + (f"<p style='color:#555'>{html.escape(result.confirm_note)}</p>" if result.confirm_note else ""))


def _disagreements(result) -> str:
    if not result.confirmations:
        return ""
    found = result.disagreements
    if not found:
        return "<p style='color:#1a7f37'>CPU and HTP agree on these plans (the same ones reach the target, in " \
               "the same order).</p>"
    items = "".join(f"<li>{html.escape(line)}</li>" for line in found)
    return f"<p style='margin:4px 0'><b>CPU and HTP disagree:</b></p><ul style='margin:0 0 4px 16px'>{items}</ul>"


def _unbuildable(result) -> str:
    """The plans the search's backends could not build, and why (QNN's words come from a device: text, escaped)."""
    if not result.unbuildable:
        return ""
    items = "".join(f"<li>plan {f.plan_id} {html.escape(f.name)}: {html.escape(f.reason)}</li>"
                    for f in result.unbuildable)
    where = ", ".join(dict.fromkeys(html.escape(f.where) for f in result.unbuildable))
    return (f"<p style='margin:4px 0'><b>Cannot build on {where}</b> (passed over):</p>"
            f"<ul style='margin:0 0 4px 16px;color:#b00020'>{items}</ul>")


def _interval(low, high) -> str:
    return f"{value_text(low)}\u2013{value_text(high)}" if low is not None and high is not None else "-"


def _alternatives(result) -> str:
    """Every plan the recommendation chose among, by estimated latency, with its value, interval, estimate and why
    it was not picked (`choice.Considered`); the front's plans much better for little more are marked."""
    much_better = {e.plan_id for e in result.alternatives}
    rule = ("at least 3 dB more" if result.float_value is None else
            f"at most {MUCH_BETTER:.0%} of the distance from the float model's value")
    note = (f"<p style='margin:2px 0;color:#555'>&#9733; much better for little more (at most {LITTLE_MORE:.0%} more "
            f"estimated latency, {rule}).</p>" if much_better else
            "<p style='margin:2px 0;color:#555'>No plan of the front is much better for little more latency.</p>")
    considered = result.considered
    if not considered:  # an older result: only the front's alternatives are known
        considered = [SimpleNamespace(plan_id=e.plan_id, name=e.name, value=e.value, low=e.low, high=e.high,
                                      estimate_ms=estimate_ms(e), verdict="much better for little more")
                      for e in (result.recommended, *result.alternatives)]
    source = html.escape(result.recommended.accuracy_source)
    # Narrow padding: the table shares the card with the answer, in a 1280-wide window too.
    cell, head, text = (style.replace("8px", "5px") for style in (_CELL, _HEAD, _TEXT))
    rows = []
    for c in considered:
        picked = c.plan_id == result.recommended.plan_id
        mark = " style='background:#fff4d6;font-weight:600'" if picked else ""
        star = " &#9733;" if c.plan_id in much_better else ""
        estimate = f"{c.estimate_ms:.3f}" if math.isfinite(c.estimate_ms) else "-"
        rows.append(f"<tr{mark}><td style='{cell}'>{c.plan_id}</td><td style='{cell};text-align:left'>"
                    f"{html.escape(c.name)}{star}</td><td style='{cell}'>{value_text(c.value)}</td>"
                    f"<td style='{cell}'>{_interval(c.low, c.high)}</td><td style='{cell}'>{estimate}</td>"
                    f"<td style='{text}'>{html.escape('picked' if picked else c.verdict)}</td></tr>")
    return (f"<p style='margin:4px 0'><b>Plans considered</b> ({len(considered)}, {html.escape(result.metric)} on "
            f"{source}, by estimated latency):</p>"
            f"<div style='overflow-x:auto'><table class='mpstudio-considered' style='border-collapse:collapse;"
            f"font-size:12px;margin:2px 0;width:100%'><tr>"
            f"<th style='{head}'>plan</th><th style='{head};text-align:left'>name</th><th style='{head}'>value</th>"
            f"<th style='{head}'>95 % interval</th><th style='{head}'>est. ms</th>"
            f"<th style='{head};text-align:left'>why not picked</th></tr>{''.join(rows)}</table></div>{note}")


def search_card_html(result) -> str:
    """The card's body for a SearchResult."""
    r = result.recommended
    est = estimate_ms(r)
    verdict = ("within noise of the target" if result.within_noise else
               "reaches the target" if result.reached else "misses the target")
    colour = "#8a6d00" if result.within_noise else "#1a7f37" if result.reached else "#b42318"
    baselines = "; ".join(f"{html.escape(k)} {value_text(v.value)}" for k, v in result.baselines.items())
    head = (f"<div class='mpstudio-search-pick' style='font-size:14px'><b>Recommended: plan {r.plan_id} "
            f"{html.escape(r.name)}</b> &mdash; {html.escape(result.metric)} {value_text(r.value)}"
            f"{html.escape(r.interval_text())} "
            f"[{html.escape(r.accuracy_source)}], {_ms(est)} estimated, <span style='color:{colour}'>{verdict}"
            f"</span></div>")
    facts = (f"<div style='font-size:12px;color:#555'>{result.evaluations} evaluations ({result.new_evaluations} "
             f"new){f', {len(result.confirmations)} confirming' if result.confirmed else ''}; stopped: "
             f"{html.escape(result.stop_reason)}; baselines: {baselines}"
             + (f"; float model {value_text(result.float_value)}" if result.float_value is not None else "") + "</div>")
    why = f"<p style='margin:6px 0'><b>Why this plan.</b> {_why(result)}</p>"
    # Two columns where the window has room (the answer and why; the plans it was chosen among), so that the
    # card's few lines show both without scrolling; one under the other in a narrow window.
    return (f"<div class='mpstudio-search-card' style='font-size:13px;line-height:1.4;overflow-wrap:anywhere;"
            f"display:flex;flex-wrap:wrap;gap:0 18px'><div style='flex:1 1 320px;min-width:0'>{head}{facts}{why}"
            f"{_confirmation_table(result)}{_unbuildable(result)}{_disagreements(result)}</div>"
            f"<div style='flex:1.4 1 470px;min-width:0'>{_alternatives(result)}</div></div>")


class SearchCard(View):
    """The last search's answer, in a card under the job bar (collapsible; hidden until a search ends)."""

    state = param.ClassSelector(class_=StudioState)

    def __init__(self, **params):
        super().__init__(**params)
        # At most a fifth of a laptop screen: longer answers scroll inside the card, the views keep their room.
        self._body = pn.pane.HTML("", sizing_mode="stretch_width", margin=(0, 6), max_height=170,
                                  styles={"overflow-y": "auto"})
        self._card = pn.Card(self._body, title="Search result", collapsible=True, sizing_mode="stretch_width",
                             visible=False, css_classes=["mpstudio-search-result"], margin=(4, 10))
        self.state.param.watch(self._on_result, "search_result")
        self._on_result()

    def _on_result(self, *_):
        result = self.state.search_result
        if result is None:
            self._card.visible = False
            return
        self._body.object = search_card_html(result)
        self._card.title = f"Search result: {result.target}"
        self._card.collapsed = False
        self._card.visible = True

    @laid_out_once
    def __panel__(self):
        return self._card
