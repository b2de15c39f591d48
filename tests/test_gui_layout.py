"""The studio's layout in headless Chromium at common window sizes: no view drawn over another, no text cut at the
right edge, the error toast clear of the views, the QNN report's long lines wrapped in their card."""

from __future__ import annotations

import pytest

from gui_support import chromium_path, figure_box, make_small_study, on_loop, open_studio, studio_server, wait_until

pytestmark = [pytest.mark.skipif(chromium_path() is None, reason="no Chromium: run scripts/install-browser"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")]

SIZES = [(1280, 800), (1600, 1000), (1920, 1080)]


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    with studio_server(make_small_study(tmp_path_factory.mktemp("gui-layout") / "study")) as server:
        yield server


def box(page, selector: str) -> dict:
    """The page rectangle of the first element matching `selector` (Playwright's locators pierce Panel's shadow
    roots), in page coordinates (scrolled content included)."""
    found = page.locator(selector).first
    found.wait_for(state="visible")
    return found.evaluate("(el) => { const r = el.getBoundingClientRect(); "
                          "return {x: r.left, y: r.top, width: r.width, height: r.height, "
                          "scroll: el.scrollWidth, client: el.clientWidth}; }")


def overlap(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


@pytest.mark.parametrize("width,height", SIZES)
def test_views_do_not_overlap(browser, studio, width, height):
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(60000)
    try:
        state = open_studio(page, studio)
        plot = wait_until(lambda: figure_box(page, "pareto"), 30, message="no Pareto plot")
        caption = box(page, ".mpstudio-ranking-caption")
        status = box(page, ".mpstudio-ranking-status")
        table = box(page, ".tabulator")
        for name, part in (("caption", caption), ("status", status), ("table", table)):
            assert not overlap(plot, part), f"at {width}x{height} the Pareto plot {plot} overlaps the ranking's " \
                                            f"{name} {part}"
            assert part["x"] + part["width"] <= width + 0.5, f"at {width}x{height} the ranking's {name} is cut " \
                                                            f"at the right edge: {part}"
        assert caption["scroll"] <= caption["client"] + 1, f"the caption's text is cut: {caption}"
        # The tabs under the plot (the ranking's among them): the plot's axis label must not run into them.
        tab = box(page, "text=Time per node")
        assert not overlap(plot, tab), f"at {width}x{height} the Pareto plot {plot} overlaps the tabs {tab}"
        header = box(page, "text=Accuracy vs latency")

        on_loop(state, lambda: state.show_error("an error whose message is long enough to need more than one line of "
                                                "the toast: " * 3))
        toast = box(page, ".mpstudio-toast")
        assert toast["y"] + toast["height"] <= header["y"], f"at {width}x{height} the toast {toast} covers the " \
                                                            f"Pareto header {header}"
        assert not overlap(toast, plot)
    finally:
        context.close()


def test_the_qnn_report_wraps_its_long_lines(page, studio):
    open_studio(page, studio)
    page.get_by_text("QNN support report").first.click()
    report = box(page, "pre.qnn-report")
    assert "sha256" in page.locator("pre.qnn-report").first.text_content()
    assert report["scroll"] <= report["client"], f"the report's lines overflow its card: {report}"
