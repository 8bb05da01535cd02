"""Step 4 of run_real_comfyui.py, in the stock front end (headless Chromium): every template loads as the
template browser loads it (no missing node, none in error, no console error of ours, graphToPrompt() is its
API twin, typed Wan2.2 values survive the widgets' snapping), the template browser shows a card for each,
and every frozen released workflow still loads as it did.

A console error counts as ours unless the stock front end throws it by itself (``FRONTEND_OWN_ERRORS``,
``_new_errors``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import behaviour_checks as bc
import workflow_defs as wf
from comfy_harness import (LOAD_AND_INSPECT_JS, PACK_NAME, WORKFLOWS, ComfyUI, browser_page, close_dialogs,
                           put_media_inputs, save_png)

TEMPLATE = bc.TI2V_TEMPLATE
# The stock front end logs errors of its own in an offline sandbox (no internet, no
# ComfyUI-Manager, a fresh user folder). Those are not ours: an error counts when it is a page
# error or a console error other than a failed resource, or a failed response for something
# the pack serves or a template needs (its templates and thumbnails, /view of its input image).
OURS_IN_URL = (f"/workflow_templates/{PACK_NAME}/", "/api/workflow_templates", "/view?", "/object_info")
# Page errors of the stock front end's own code, identified one by one (they happen with no custom
# node at all): (message, a function of the front end's bundle in its stack) -> what it is. Any other
# page error counts as ours, so a new one fails the check until someone has looked at it.
FRONTEND_OWN_ERRORS = {
    ("Cannot read properties of undefined (reading 'id')", "addSetting"): (
        "ComfyUI front end 1.27.10 at startup on a fresh user folder: registering its core settings runs "
        "Comfy.Canvas.NavigationMode's onChange, which sets Comfy.Canvas.LeftMouseClickBehavior before that "
        "setting is registered; the setting store's onChange then reads .id of undefined"),
}



def _frontend_own(kind: str, text: str, where: str) -> str:
    """What this page error of the stock front end is (FRONTEND_OWN_ERRORS), "" when it may be ours:
    thrown in the front end's own bundle (/assets/), naming no extension of ours."""
    if kind != "pageerror" or PACK_NAME in where or "/extensions/" in where or "/assets/" not in where:
        return ""
    return next((why for (message, function), why in FRONTEND_OWN_ERRORS.items()
                 if text == message and f".{function} (" in where), "")


def _new_errors(console: list, start: int) -> list:
    errors = []
    for kind, text, url in console[start:]:
        if _frontend_own(kind, text, url):
            continue
        if kind == "pageerror" or (kind == "error" and not text.startswith("Failed to load resource")):
            errors.append((kind, text, url))
        elif kind == "requestfailed" and text == "net::ERR_ABORTED" and "/view?type=input&filename=control.mp4" in url:
            continue     # Load Video's <video> preview: the browser ends its own range requests as it buffers
        elif kind in ("http", "requestfailed") and any(part in url for part in OURS_IN_URL):
            errors.append((kind, text, url))
    return errors


GRAPH_BOX_JS = """() => {
  const ds = app.canvas.ds, r = app.canvas.canvas.getBoundingClientRect();
  let x0 = 1e9, y0 = 1e9, x1 = -1e9, y1 = -1e9;
  for (const n of app.graph._nodes) {
    x0 = Math.min(x0, n.pos[0]); y0 = Math.min(y0, n.pos[1] - LiteGraph.NODE_TITLE_HEIGHT);
    x1 = Math.max(x1, n.pos[0] + n.size[0]); y1 = Math.max(y1, n.pos[1] + n.size[1]);
  }
  const sx = x => r.left + (x + ds.offset[0]) * ds.scale, sy = y => r.top + (y + ds.offset[1]) * ds.scale;
  return [sx(x0), sy(y0), sx(x1), sy(y1)];
}"""


def _save_thumbnail(png: Path, box: list[float], jpg: Path) -> int:
    """A 512x512 JPEG of the graph alone (the template browser shows square cards)."""
    from PIL import Image

    with Image.open(png) as im:
        shot = im.convert("RGB")
        margin = 16
        left, top = max(0, int(box[0]) - margin), max(0, int(box[1]) - margin)
        right, bottom = min(shot.width, int(box[2]) + margin), min(shot.height, int(box[3]) + margin)
        graph = shot.crop((left, top, right, bottom))
        side = max(graph.width, graph.height)
        card = Image.new("RGB", (side, side), shot.getpixel((left, top)))
        card.paste(graph, ((side - graph.width) // 2, (side - graph.height) // 2))
        card.resize((512, 512), Image.Resampling.LANCZOS).save(jpg, format="JPEG", quality=85, optimize=True)
    return jpg.stat().st_size


# Type values into Generate video's number widgets the way the front end applies an edit (its
# INT widgets snap an edit to min + k*step): the values the Wan2.2 rules ask for must survive.
TYPE_VALUES_JS = """(values) => {
  const node = app.graph._nodes.find(n => n.type.startsWith('VLLMOmniGenerate'));
  const got = [];
  for (const [name, value] of values) {
    const w = node.widgets.find(x => x.name === name);
    const before = w.value;
    w.callback.call(w, value, app.canvas, node);
    got.push([name, value, w.value]);
    w.value = before;
  }
  return got;
}"""
MODEL_VALUES = [["frames", 81], ["frames", 121], ["frames", 5], ["width", 832], ["height", 480],
                ["width", 1280], ["height", 704], ["steps", 40], ["seed", 123456789]]
S2V_VALUES = [["frames", 80], ["frames", 16], ["width", 832], ["height", 448], ["steps", 40],   # frames per part
              ["seed", 123456789]]


def _template_browser_cards(page: Any) -> list[str]:
    """Open Templates (the front end opens it by itself on a fresh user folder), pick our pack."""
    if not page.evaluate("() => document.querySelectorAll('.p-dialog').length"):
        page.evaluate("() => app.extensionManager.command.execute('Comfy.BrowseTemplates')")
    page.get_by_text(PACK_NAME, exact=True).first.click()
    cards = page.locator("[data-testid^='template-workflow-']")
    page.wait_for_function("(n) => document.querySelectorAll(\"[data-testid^='template-workflow-']\").length >= n",
                           arg=5, timeout=30_000)
    return sorted(cards.nth(i).get_attribute("data-testid").removeprefix("template-workflow-")
                  for i in range(cards.count()))


def check_templates_in_browser(comfy: ComfyUI, screenshots: Path, thumbnails: bool = False) -> dict:
    report: dict[str, Any] = {}
    names = sorted(wf.EXPECTED_TEMPLATES)
    put_media_inputs(comfy.base / "input")      # the VACE / S2V loaders' files: their previews load
    with browser_page(comfy.url) as (page, console):
        report["frontend"] = page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__ || null")
        startup = _new_errors(console, 0)
        assert not startup, f"console errors at front-end startup: {startup}"
        report["frontend_startup_errors"] = len(startup)
        report["frontend_own_errors"] = [why for kind, text, where in console
                                         if (why := _frontend_own(kind, text, where))]
        close_dialogs(page)
        page.evaluate("() => app.extensionManager.setting.set('Comfy.Minimap.Visible', false)")

        # Each template as the template browser loads it: fetched from the pack's template route,
        # then app.loadGraphData(json, true, true, name).
        for name in names:
            mark = len(console)
            graph = page.evaluate(
                "async (url) => (await fetch(url)).json()", f"/api/workflow_templates/{PACK_NAME}/{name}.json")
            assert graph == wf.load(WORKFLOWS / f"{name}.json"), f"{name}: served template differs from the file"
            result = page.evaluate(LOAD_AND_INSPECT_JS, [graph, name])
            assert not result["dialogs"], f"{name}: dialog after load: {result['dialogs']}"
            unknown = [n["type"] for n in result["nodes"] if not n["registered"]]
            assert not unknown, f"{name}: unknown node types {unknown}"
            in_error = [n["type"] for n in result["nodes"] if n["has_errors"]]
            assert not in_error, f"{name}: nodes in error {in_error}"
            assert [n["type"] for n in result["nodes"]] == [n["type"] for n in graph["nodes"]]
            twin = wf.load(WORKFLOWS / "api" / f"{name}.api.json")
            assert result["api"] == twin, f"{name}: graphToPrompt() differs from the API twin:\n" \
                                          f"{json.dumps(result['api'], indent=1)[:3000]}"
            typed = page.evaluate(TYPE_VALUES_JS, S2V_VALUES if "s2v" in name else MODEL_VALUES)
            snapped = [(w, v, got) for w, v, got in typed if got != v]
            assert not snapped, f"{name}: the UI turns typed values into others: {snapped}"
            page.wait_for_timeout(1000)            # previews (LoadImage's /view) and redraws
            errors = _new_errors(console, mark)
            assert not errors, f"{name}: console errors while loading: {errors}"
            png = screenshots / f"{name}.png"
            entry = {"nodes": len(result["nodes"]), "screenshot": str(png), "png_bytes": save_png(page, png)}
            if thumbnails:
                entry["thumbnail_bytes"] = _save_thumbnail(png, page.evaluate(GRAPH_BOX_JS), WORKFLOWS / f"{name}.jpg")
            report[name] = entry

        # The template browser itself: our pack's cards (with their thumbnails), and a click
        # on one loads it.
        mark = len(console)
        cards = _template_browser_cards(page)
        assert cards == names, f"template browser shows {cards}"
        page.wait_for_timeout(1500)
        report["template_browser"] = {"cards": cards, "screenshot": str(screenshots / "template_browser.png"),
                                      "png_bytes": save_png(page, screenshots / "template_browser.png")}
        page.locator(f"[data-testid='template-workflow-{TEMPLATE}']").click()
        page.wait_for_function("() => !document.querySelector('.p-dialog')", timeout=30_000)
        page.wait_for_timeout(1000)
        loaded = page.evaluate("async () => ({types: app.graph._nodes.map(n => n.type), "
                               "api: (await app.graphToPrompt()).output})")
        expected = wf.load(WORKFLOWS / f"{TEMPLATE}.json")
        assert loaded["types"] == [n["type"] for n in expected["nodes"]], loaded["types"]
        assert loaded["api"] == wf.load(WORKFLOWS / "api" / f"{TEMPLATE}.api.json")
        errors = _new_errors(console, mark)
        assert not errors, f"template browser: console errors: {errors}"

        # Control: the same inspection must notice a node type this ComfyUI does not have.
        bogus = wf.load(WORKFLOWS / f"{TEMPLATE}.json")
        bogus["nodes"][-1]["type"] = "NoSuchNodeFromAnotherPack"
        result = page.evaluate(LOAD_AND_INSPECT_JS, [bogus, "control"])
        missing_seen = bool(result["dialogs"]) or any(not n["registered"] for n in result["nodes"])
        assert missing_seen, "the missing-node check did not notice an unknown node type"
        report["control_missing_node_dialog"] = [d[:100] for d in result["dialogs"]]
        close_dialogs(page)
    return report


def check_released_in_browser(comfy: ComfyUI) -> dict:
    """Every frozen released UI workflow (tests/unit/released_workflows) loads in the front end as it did: no
    missing node, none in error, no console error, and app.graphToPrompt() is its released API twin plus only
    widgets appended since then (optional inputs), at their declared defaults."""
    defs, report = wf.node_defs(), {}
    with browser_page(comfy.url) as (page, console):
        close_dialogs(page)
        for ui_path in sorted(p for p in wf.RELEASED.glob("*.json") if not p.name.endswith(".api.json")):
            name, mark = ui_path.stem, len(console)
            result = page.evaluate(LOAD_AND_INSPECT_JS, [wf.load(ui_path), name])
            assert not result["dialogs"], f"{name}: dialog after load: {result['dialogs']}"
            assert all(n["registered"] and not n["has_errors"] for n in result["nodes"]), (name, result["nodes"])
            twin, api, appended = wf.load(ui_path.with_name(f"{name}.api.json")), result["api"], {}
            assert sorted(api) == sorted(twin), f"{name}: nodes {sorted(api)} != {sorted(twin)}"
            for node_id, entry in twin.items():
                got = api[node_id]["inputs"]
                assert api[node_id]["class_type"] == entry["class_type"]
                assert {k: got.get(k) for k in entry["inputs"]} == entry["inputs"], (name, node_id, got)
                for key in sorted(set(got) - set(entry["inputs"])):
                    spec = next(((s, section) for n, s, section in defs[entry["class_type"]].inputs if n == key), None)
                    assert spec is not None and spec[1] == "optional" and got[key] == spec[0][1].get("default"), \
                        f"{name}: {entry['class_type']}.{key} = {got[key]!r} is not an appended widget at its default"
                    appended[f"{entry['class_type']}.{key}"] = got[key]
            errors = _new_errors(console, mark)
            assert not errors, f"{name}: console errors while loading: {errors}"
            report[name] = {"nodes": len(result["nodes"]), "appended": appended}
    return report

