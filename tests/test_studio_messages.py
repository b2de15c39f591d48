"""The studio's message line: one line whatever the message, cut with an ellipsis and whole in its tooltip."""

from __future__ import annotations

from mpstudio.widgets.studio import message_html


def test_a_long_message_is_cut_with_an_ellipsis_and_whole_in_the_tooltip():
    message = ("recommended plan 7 a8w8-pc+12x16 (cosine 0.99991 <better> than 'a16w8+10%'); " * 4).strip()
    shown = message_html(message)
    assert "text-overflow:ellipsis" in shown and "overflow:hidden" in shown and "white-space:nowrap" in shown
    escaped = message.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("'", "&#x27;")
    assert f"title='{escaped}'" in shown  # the whole message, quotes escaped so the attribute holds it all
    assert shown.count(escaped) == 2 and "<better>" not in shown
