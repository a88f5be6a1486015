"""moe_tutorial/source.py: kernels shown from the package, whole or by marked section."""
import moe_tutorial  # noqa: F401  (picks the runtime before triton loads)
from moe_tutorial.source import section_source, sections, show_source

import pytest
import triton
import triton.language as tl


@triton.jit
def _marked(x_ptr, BLOCK: tl.constexpr):
    # [offsets]
    offs = tl.arange(0, BLOCK)
    # [load and store]
    x = tl.load(x_ptr + offs)
    tl.store(x_ptr + offs, x + 1)


def test_sections_are_found_in_order_and_cut_at_the_next_marker():
    assert sections(_marked) == ["offsets", "load and store"]
    assert section_source(_marked, "offsets") == "offs = tl.arange(0, BLOCK)\n"
    assert section_source(_marked, "load and store").splitlines() == [
        "x = tl.load(x_ptr + offs)", "tl.store(x_ptr + offs, x + 1)"]


def test_show_source_renders_highlighted_code_whose_text_is_the_source():
    shown = show_source(_marked)
    assert shown.data.startswith("@triton.jit\ndef _marked(") and "<span" in shown._repr_html_()
    assert show_source(_marked, "offsets").data == "offs = tl.arange(0, BLOCK)\n"


def test_an_unknown_section_names_the_known_ones():
    with pytest.raises(ValueError, match=r"^section: expected one of the sections marked in _marked "
                                         r"\('offsets', 'load and store'\), got 'gather'"):
        section_source(_marked, "gather")
