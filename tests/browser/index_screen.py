"""What a reader sees first of a report index: the first 1,400 x 900 screen holds headline
findings and a figure, no table, and every findings table is folded (issue 34). Shared by
the report built from the tests' runs (tests/browser) and the served-only report
(tests/vllm/test_served_report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FIRST_SCREEN = """() => {
    // on the first screen and drawn: a closed <details> keeps a box for its content
    const visible = el => { const r = el.getBoundingClientRect();
        return r.width > 0 && r.height > 0 && r.top < window.innerHeight && r.bottom > 0
            && el.checkVisibility() && !el.closest('details:not([open])'); };
    return {
        headlines: Array.from(document.querySelectorAll('.headline')).filter(visible).length,
        figures: Array.from(document.querySelectorAll('.headline img'))
            .filter(i => visible(i) && i.complete && i.naturalWidth > 0).length,
        tables: Array.from(document.querySelectorAll('table')).filter(visible).length,
        tableIds: Array.from(document.querySelectorAll('table')).filter(visible).map(t => t.id),
        folded: Array.from(document.querySelectorAll('details')).filter(d => !d.open
            && d.querySelector('table')).length,
        tablesInFindings: document.querySelectorAll('#findings ~ details table').length,
    };
}"""


def check_first_screen(browser: Any, index: Path, screenshot: Path) -> list[str]:
    """Open ``index`` at 1,400 x 900, save the first screen to ``screenshot``, check it holds
    at least one headline and one figure and no table, and that every findings table is
    folded; returns the headlines' titles (five at most)."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(index.as_uri())
        page.wait_for_load_state("load")
        first = page.evaluate(FIRST_SCREEN)
        page.screenshot(path=str(screenshot))
        assert first["headlines"] >= 1 and first["figures"] >= 1, first
        assert first["tables"] == 0, first
        assert first["folded"] == first["tablesInFindings"] > 0, first
        headlines = page.locator(".headline h3").all_inner_texts()
        assert 1 <= len(headlines) <= 5, headlines
        return headlines
    finally:
        page.close()
