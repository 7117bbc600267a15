"""The generative families' box conventions (``models.generative.parsing``) against the authors' own parsers, run in
scratch environments on the same texts; their outputs are committed under ``tests/data/generative`` (each file names
the repository, commit and function): MAIRA-2's processor (``convert_output_to_plaintext_or_grounded_sequence``,
``adjust_box_for_original_image_size``), RadVLM's ``extract_bounding_boxes``, the Qwen2.5-VL cookbook's
``parse_json``, and the MedGemma notebook's box cell. Where our rule departs from theirs on purpose, the test says so
and why."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from xbench_pl.geometry import Preprocess
from xbench_pl.models.generative.parsing import (ParseError, gemma_boxes, maira2_boxes, maira2_phrases, qwen_boxes,
                                                 radvlm_boxes, radvlm_normalised)

DATA = Path(__file__).resolve().parent / "data" / "generative"
MAIRA2 = json.loads((DATA / "maira2_processor.json").read_text())
RADVLM = json.loads((DATA / "radvlm_parsing.json").read_text())
QWEN_MEDGEMMA = json.loads((DATA / "qwen_medgemma_parsing.json").read_text())
QWEN, MEDGEMMA = QWEN_MEDGEMMA["qwen"]["cases"], QWEN_MEDGEMMA["medgemma"]["cases"]

MAIRA2_SIDE = 518  # MAIRA-2's processed square (BitImageProcessor: shortest edge 518, centre crop 518)


def assert_boxes(ours, theirs, tol: float = 1e-12) -> None:
    """Boxes as lists of floats (our tuples, their tuples or JSON lists), equal within ``tol``."""
    ours, theirs = [list(map(float, box)) for box in ours], [list(map(float, box)) for box in theirs]
    assert len(ours) == len(theirs), (ours, theirs)
    for a, b in zip(ours, theirs):
        assert len(a) == len(b) and all(math.isclose(x, y, rel_tol=0, abs_tol=tol) for x, y in zip(a, b)), (ours, theirs)


def test_the_vectors_name_their_sources():
    assert "maira" in MAIRA2["source"] and "convert_output_to_plaintext_or_grounded_sequence" in MAIRA2["source"]
    assert RADVLM["source"].startswith("uzh-dqbm-cmi/RadVLM@") and "extract_bounding_boxes" in RADVLM["source"]
    assert "parse_json" in QWEN_MEDGEMMA["qwen"]["source"] and "medgemma" in QWEN_MEDGEMMA["medgemma"]["source"]


# -- MAIRA-2 ---------------------------------------------------------------------------------------
MAIRA2_PARSED = [c for c in MAIRA2["parse_cases"] if "parsed" in c]
MAIRA2_RAISING = [c for c in MAIRA2["parse_cases"] if "raises" in c]


def test_maira2_cases_cover_both_outcomes_and_both_exceptions():
    assert len(MAIRA2_PARSED) >= 20 and len(MAIRA2_RAISING) >= 20
    assert {c["raises"].split(":")[0] for c in MAIRA2_RAISING} == {"AssertionError", "ValueError"}


@pytest.mark.parametrize("case", MAIRA2_PARSED, ids=[c["name"] for c in MAIRA2_PARSED])
def test_maira2_phrases_is_the_processors_reading(case):
    ours, theirs = maira2_phrases(case["text"]), case["parsed"]
    if isinstance(theirs, str):  # no grounding syntax: the plain text, stripped
        assert ours == theirs
        return
    assert isinstance(ours, list) and len(ours) == len(theirs)
    for (phrase, boxes), (their_phrase, their_boxes) in zip(ours, theirs):
        assert phrase == their_phrase
        if their_boxes is None:
            assert boxes is None
        else:
            assert_boxes(boxes, their_boxes)


@pytest.mark.parametrize("case", MAIRA2_RAISING, ids=[c["name"] for c in MAIRA2_RAISING])
def test_maira2_phrases_fails_where_the_processor_raises(case):
    # theirs raises a bare AssertionError (text outside <obj> spans, unclosed tags, bins >= 100) or a ValueError (a box
    # without 4 contiguous coordinates); ours raises ParseError for each, so the pair counts as a parse failure
    with pytest.raises(ParseError):
        maira2_phrases(case["text"])
    with pytest.raises(ParseError):
        maira2_boxes(case["text"], MAIRA2_SIDE)


@pytest.mark.parametrize("size", [MAIRA2_SIDE, 100])
def test_maira2_boxes_are_the_bin_centres_in_pixels_of_the_processed_square(size):
    checked = 0
    for case in MAIRA2_PARSED:
        theirs = case["parsed"]
        expected = [] if isinstance(theirs, str) else [[v * size for v in box] + [1.0]
                                                        for _, boxes in theirs for box in boxes or ()]
        assert_boxes(maira2_boxes(case["text"], size), expected, tol=1e-9)
        checked += bool(expected)
    assert checked >= 15


def test_maira2_boxes_of_the_docstring_example_by_hand():
    # the processor's docstring: <x55><y45><x70><y56> -> (0.555, 0.455, 0.705, 0.565); the ungrounded phrase adds none
    text = "<obj>grounded phrase <box><x55><y45><x70><y56></box></obj><obj>ungrounded phrase</obj>"
    assert_boxes(maira2_boxes(text, 200), [[111.0, 91.0, 141.0, 113.0, 1.0]], tol=1e-9)


ADJUST_CHECKED = [c for c in MAIRA2["adjust_cases"] if all(0 <= v <= 1 for v in c["box"])]  # their no-clamp cases aside


def test_maira2_adjust_cases_checked_cover_square_portrait_landscape_and_odd_sizes():
    shapes = {(c["width"], c["height"]) for c in ADJUST_CHECKED}
    assert any(w == h for w, h in shapes) and any(w < h for w, h in shapes) and any(w > h for w, h in shapes)
    assert any((max(w, h) - min(w, h)) % 2 for w, h in shapes) and len(ADJUST_CHECKED) >= 40


@pytest.mark.parametrize("case", ADJUST_CHECKED, ids=[c["name"] for c in ADJUST_CHECKED])
def test_maira2_box_mapped_through_the_crop_preprocess_lands_on_the_processors_adjusted_box(case):
    # The repo maps a stated box u (pixels of the 518 input) back as x = (u - tx) / sx through the affine of MAIRA-2's
    # Preprocess(resize="crop", size=518, crop_offset="floor") (short side to 518, then the centre crop, its offset
    # floored in input pixels as the release's processor, transformers' center_crop); the processor's
    # adjust_box_for_original_image_size takes int(b * crop + (W - crop) // 2): the offset in original pixels, then
    # truncated to a whole original pixel. They model the same crop; they differ by that truncation (< 1 original
    # pixel) and by where the offset falls (at most half an input pixel, 0.5 / s original pixels). Not a flat 1.5
    # original pixels: on 3000 x 2000 (s = 0.259) their offset 500 is 129.5 input pixels, the processor's 129 (1.93
    # original pixels).
    width, height = case["width"], case["height"]
    _, (sx, sy, tx, ty) = Preprocess(resize="crop", size=MAIRA2_SIDE, crop_offset="floor").plan(height, width)
    u = [v * MAIRA2_SIDE for v in case["box"]]
    ours = [(u[0] - tx) / sx, (u[1] - ty) / sy, (u[2] - tx) / sx, (u[3] - ty) / sy]
    theirs = [a * s for a, s in zip(case["adjusted"], (width, height, width, height))]
    assert max(abs(a - b) for a, b in zip(ours, theirs)) <= 1 + 0.5 / min(sx, sy) + 1e-9, (ours, theirs)
    if width == height and width > MAIRA2_SIDE:  # no offset on a square: only their truncation is left
        assert all(-1e-9 <= a - b < 1 for a, b in zip(ours, theirs)), (ours, theirs)


# -- RadVLM ----------------------------------------------------------------------------------------
RADVLM_CASES = RADVLM["cases"]


def radvlm_id(case: dict) -> str:
    return case["text"][:40] or "empty"


def test_radvlm_regex_is_the_one_the_vectors_were_run_with():
    from xbench_pl.models.generative import parsing

    assert parsing._RADVLM_BOX.pattern == RADVLM["regex"]


@pytest.mark.parametrize("case", RADVLM_CASES, ids=[radvlm_id(c) for c in RADVLM_CASES])
def test_radvlm_normalised_against_extract_bounding_boxes(case):
    text, theirs = case["text"], case["parsed"]
    if isinstance(theirs, dict):  # '[0.1.2, ...]': their float() raises ValueError (evaluate_boxes crashes)
        assert theirs["raises"].startswith("ValueError")
        with pytest.raises(ParseError):
            radvlm_normalised(text)
    elif theirs:  # every box they read, in order
        assert_boxes(radvlm_normalised(text), theirs, tol=0)
    elif "[" in text:
        # a bracketed list their regex silently skips (3 or 5 numbers, a negative, 1e-2, a space after '[' or before
        # ','): the model tried to state a box, so ours counts it as a parse failure instead of "no box"
        with pytest.raises(ParseError):
            radvlm_normalised(text)
    else:  # no bracketed list at all (plain text, parentheses, CheXagent's <|box|>): no box, no failure
        assert radvlm_normalised(text) == []


def test_radvlm_cases_cover_every_outcome():
    outcomes = {"raises" if isinstance(c["parsed"], dict) else "boxes" if c["parsed"] else "skipped" if "[" in c["text"]
                else "none" for c in RADVLM_CASES}
    assert outcomes == {"raises", "boxes", "skipped", "none"}


def test_radvlm_boxes_scale_the_normalised_boxes_to_the_input_square():
    for case in RADVLM_CASES:
        if isinstance(case["parsed"], list) and case["parsed"]:
            assert_boxes(radvlm_boxes(case["text"], 384), [[v * 384 for v in box] + [1.0] for box in case["parsed"]], tol=1e-9)


# -- Qwen2.5-VL (Lingshu) --------------------------------------------------------------------------
def qwen_expected(case: dict) -> list[list[float]]:
    return [item["bbox_2d"] + [1.0] for item in case["json_loads_of_parse_json"]]


QWEN_AGREE = [name for name, c in QWEN.items() if isinstance(c["json_loads_of_parse_json"], list)
              and all(isinstance(i, dict) and len(i.get("bbox_2d", ())) == 4 for i in c["json_loads_of_parse_json"])]


def test_qwen_cases_where_the_cookbook_parses_include_fenced_unfenced_and_several():
    assert {"one_box_fenced", "several_boxes_fenced", "unfenced_list", "prose_then_fence", "crlf_line_endings",
            "two_fenced_blocks", "empty_list"} <= set(QWEN_AGREE)


@pytest.mark.parametrize("name", QWEN_AGREE)
def test_qwen_boxes_equal_the_cookbook_parse(name):
    # corners as stated (inverted_corners, box_outside_image pass through: clip_boxes orders and clips them later)
    assert_boxes(qwen_boxes(QWEN[name]["text"]), qwen_expected(QWEN[name]), tol=0)


@pytest.mark.parametrize("name", ["malformed_missing_comma", "box_with_3_numbers", "wrong_key_bbox",
                                  "truncated_mid_list_malformed", "fence_uppercase_JSON"])
def test_qwen_boxes_fail_on_unreadable_box_syntax(name):
    case = QWEN[name]
    if name == "box_with_3_numbers":  # json parses; their plot_bounding_boxes then fails (IndexError)
        assert len(case["json_loads_of_parse_json"][0]["bbox_2d"]) == 3 and "raises" in case["cookbook_plot"]
    elif name == "wrong_key_bbox":  # "bbox" for "bbox_2d": theirs KeyError
        assert case["cookbook_plot"]["raises"].startswith("KeyError")
    elif name == "truncated_mid_list_malformed":
        # generation cut mid-list: json.loads fails; the cookbook's plot repairs the text and keeps the first box.
        # Ours: a parse failure (no fence closes it), not a guess at the complete boxes
        assert "raises" in case["json_loads_of_parse_json"] and case["cookbook_plot"] == {"n_boxes": 1}
    else:  # malformed JSON, or a ```JSON fence the cookbook does not strip: both of theirs fail too
        assert "raises" in case["json_loads_of_parse_json"] and "raises" in case["cookbook_plot"]
    with pytest.raises(ParseError):
        qwen_boxes(case["text"])


@pytest.mark.parametrize("name", ["fence_not_alone_on_line", "fence_no_newline_medgemma_style", "fence_with_trailing_space"])
def test_qwen_boxes_read_fences_the_cookbook_misses(name):
    # the cookbook keeps only what follows a line that is exactly "```json"; a fence after a prefix, without a newline
    # or with a trailing space makes its json.loads fail. Ours reads the first fenced block wherever it is: the same
    # JSON as the plainly fenced case, so the same box
    case = QWEN[name]
    assert "raises" in case["json_loads_of_parse_json"]
    assert_boxes(qwen_boxes(case["text"]), qwen_expected(QWEN["one_box_fenced"]), tol=0)


def test_qwen_boxes_json_literals_and_a_bare_object():
    # true/false/null: JSON (json.loads reads it); the cookbook's ast.literal_eval does not, and plots nothing
    assert QWEN["json_true_false_null"]["cookbook_plot"] == {"n_boxes": 0}
    assert_boxes(qwen_boxes(QWEN["json_true_false_null"]["text"]), qwen_expected(QWEN["json_true_false_null"]), tol=0)
    # a single object instead of a list: the cookbook iterates its keys (TypeError); ours reads it as a list of one
    single = QWEN["single_object_not_list"]
    assert single["cookbook_plot"]["raises"].startswith("TypeError")
    assert_boxes(qwen_boxes(single["text"]), [single["json_loads_of_parse_json"]["bbox_2d"] + [1.0]], tol=0)


@pytest.mark.parametrize("name", ["no_box_plain_text", "plain_text_format_system_prompt"])
def test_qwen_boxes_of_text_without_json_is_no_box(name):
    # the cookbook's parse raises on any text that is not JSON; a report sentence (or the plain-text "x1,y1,x2,y2
    # label" format, which this repo does not prompt for) states no box here and is no parse failure
    assert "raises" in QWEN[name]["json_loads_of_parse_json"]
    assert qwen_boxes(QWEN[name]["text"]) == []


def test_every_qwen_case_is_checked():
    named = {"malformed_missing_comma", "box_with_3_numbers", "wrong_key_bbox", "truncated_mid_list_malformed",
             "fence_uppercase_JSON", "fence_not_alone_on_line", "fence_no_newline_medgemma_style", "fence_with_trailing_space",
             "json_true_false_null", "single_object_not_list", "no_box_plain_text", "plain_text_format_system_prompt"}
    assert set(QWEN) == set(QWEN_AGREE) | named


# -- MedGemma (Gemma 3) ----------------------------------------------------------------------------
NOTEBOOK_SIDE = 512  # the notebook draws on a 512-wide copy of the padded square: 0-1000 -> 512 on both axes
MEDGEMMA_DRAWN = [name for name, c in MEDGEMMA.items() if "boxes" in c["notebook_draw_cell"] and c["notebook_draw_cell"]["boxes"]]


def test_medgemma_notebook_frame_is_the_square():
    for name in MEDGEMMA_DRAWN:
        assert MEDGEMMA[name]["notebook_draw_cell"]["scaled_size"] == [NOTEBOOK_SIDE, NOTEBOOK_SIDE]
    assert {"notebook_recorded_output", "with_thinking_trace", "several_boxes", "fenced_with_newlines", "inverted_corners",
            "outside_0_1000", "missing_label", "float_coordinates"} <= set(MEDGEMMA_DRAWN)


@pytest.mark.parametrize("name", MEDGEMMA_DRAWN)
def test_gemma_boxes_equal_the_notebooks_boxes(name):
    # [y0, x0, y1, x1] on 0-1000 -> (x0, y0, x1, y1) pixels; corners and out-of-range values as stated, as theirs
    theirs = [box + [1.0] for box in MEDGEMMA[name]["notebook_draw_cell"]["boxes"]]
    assert_boxes(gemma_boxes(MEDGEMMA[name]["text"], NOTEBOOK_SIDE), theirs, tol=1e-9)


def test_gemma_boxes_of_the_notebooks_recorded_output_by_hand():
    text = 'Final Answer: ```json[{"box_2d": [140, 110, 340, 470], "label": "right clavicle"}]```'
    assert MEDGEMMA["notebook_recorded_output"]["text"] == text
    assert_boxes(gemma_boxes(text, 896), [[110 * 0.896, 140 * 0.896, 470 * 0.896, 340 * 0.896, 1.0]], tol=1e-9)
    assert_boxes(gemma_boxes(text, 1000), [[110, 140, 470, 340, 1.0]], tol=1e-9)


@pytest.mark.parametrize("name", ["empty_list", "no_box_plain_text"])
def test_gemma_boxes_none_stated(name):
    assert MEDGEMMA[name]["notebook_draw_cell"]["boxes"] == []
    assert gemma_boxes(MEDGEMMA[name]["text"], NOTEBOOK_SIDE) == []


@pytest.mark.parametrize("name", ["malformed_json", "truncated_no_closing_fence", "box_with_3_numbers"])
def test_gemma_boxes_fail_where_the_notebook_raises(name):
    assert "raises" in MEDGEMMA[name]["notebook_draw_cell"]
    with pytest.raises(ParseError):
        gemma_boxes(MEDGEMMA[name]["text"], NOTEBOOK_SIDE)


def test_gemma_boxes_where_the_notebook_is_silent_or_crashes():
    cell = lambda name: MEDGEMMA[name]["notebook_draw_cell"]  # noqa: E731
    # an unfenced "Final Answer: [...]" or Qwen's "bbox_2d" key: the notebook silently draws nothing (no fence / no
    # box_2d); the model did write box syntax, so ours counts a parse failure (scored as no box either way)
    for name in ("unfenced_list", "qwen_style_key_bbox_2d"):
        assert cell(name)["boxes"] == []
        with pytest.raises(ParseError):
            gemma_boxes(MEDGEMMA[name]["text"], NOTEBOOK_SIDE)
    # the notebook cuts at the LAST ``` (rfind), so a later code span breaks its JSON; ours reads the first fenced
    # block, the recorded output's box
    assert cell("trailing_code_span_after_json")["raises"].startswith("JSONDecodeError")
    assert_boxes(gemma_boxes(MEDGEMMA["trailing_code_span_after_json"]["text"], NOTEBOOK_SIDE),
                 [b + [1.0] for b in cell("notebook_recorded_output")["boxes"]], tol=1e-9)
    # a bare object: the notebook iterates a dict's keys (AttributeError); ours reads it as a list of one
    assert cell("single_object_not_list")["raises"].startswith("AttributeError")
    assert_boxes(gemma_boxes(MEDGEMMA["single_object_not_list"]["text"], NOTEBOOK_SIDE),
                 [b + [1.0] for b in cell("notebook_recorded_output")["boxes"]], tol=1e-9)


def test_every_medgemma_case_is_checked():
    named = {"empty_list", "no_box_plain_text", "malformed_json", "truncated_no_closing_fence", "box_with_3_numbers",
             "unfenced_list", "qwen_style_key_bbox_2d", "trailing_code_span_after_json", "single_object_not_list"}
    assert set(MEDGEMMA) == set(MEDGEMMA_DRAWN) | named


def test_qwen_patches_are_the_image_processors():
    """Lingshu's pixels: ``qwen_patches`` cuts the model input into Qwen2-VL's flattened patches (the frame repeated for
    the temporal patch, merge-window order) exactly as transformers' ``Qwen2VLImageProcessor`` does for an input already
    at its size (no resize, rescale or normalisation: ``Preprocess`` did those)."""
    import torch
    from transformers import Qwen2VLImageProcessor

    from xbench_pl.models.generative.lingshu import qwen_patches

    x = torch.randn(2, 3, 56, 84, generator=torch.Generator().manual_seed(0))
    processor = Qwen2VLImageProcessor(do_resize=False, do_rescale=False, do_normalize=False, do_convert_rgb=False)
    theirs = processor(images=[x[0].numpy(), x[1].numpy()], return_tensors="pt", input_data_format="channels_first")
    ours, grid = qwen_patches(x)
    assert torch.equal(grid, theirs["image_grid_thw"]) and torch.equal(ours, theirs["pixel_values"])
