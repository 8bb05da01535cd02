"""What our nodes show in the stock front end (headless Chromium), run_real_comfyui.py's step 6: Doctor's
and Server Status's reports as node text, Local Server's status text and progress bar mid-launch, and
Generate's 'Step k/N' text and moving bar mid-denoise, each with a screenshot.

ComfyUI's ``send_progress_text`` (a binary websocket event) becomes the node's ``$$node-text-preview``
widget, and the ``progress_state`` / ``progress`` events drive the node's progress bar; a recorder
installed in the page keeps every such event. Raises AssertionError saying what the page showed.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Callable, Optional

from behaviour_checks import TI2V_TEMPLATE, LauncherLogs
from comfy_harness import WORKFLOWS, ComfyUI, browser_page, close_dialogs, save_png

MID_DENOISE_PNG = "generate_mid_denoise.png"
MID_LAUNCH_PNG = "local_server_mid_launch.png"
DOCTOR_PNG = "doctor_node.png"

RECORD_EVENTS_JS = """() => {
  const api = (window.comfyAPI && window.comfyAPI.api && window.comfyAPI.api.api) || window.app.api;
  window.__vllmEvents = [];
  for (const t of ['execution_start', 'executing', 'executed', 'execution_success', 'execution_error',
                   'execution_interrupted', 'execution_cached', 'progress', 'progress_state', 'progress_text']) {
    api.addEventListener(t, e => window.__vllmEvents.push([t, Date.now(), JSON.parse(JSON.stringify(e.detail ?? null))]));
  }
  return !!api;
}"""

# What the front end shows on one node: its text preview (from progress_text) and every widget value.
NODE_VIEW_JS = """(id) => {
  const n = app.graph.getNodeById(id);
  if (!n) return null;
  const widgets = (n.widgets || []).map(w => [w.name, typeof w.value === 'string' ? w.value : JSON.stringify(w.value)]);
  const preview = widgets.find(([name]) => name === '$$node-text-preview');
  return {type: n.type, preview: preview ? preview[1] : null, widgets};
}"""

PROGRESS_OF_JS = """(id) => (window.__vllmEvents || []).filter(([t, , d]) =>
    (t === 'progress' && String(d.node) === String(id)) ||
    (t === 'progress_state' && d.nodes && d.nodes[id] && d.nodes[id].max > 0))
  .map(([t, at, d]) => t === 'progress' ? [d.value, d.max] : [d.nodes[id].value, d.nodes[id].max])"""

# Put a few nodes in view at a readable scale (the text preview makes nodes taller).
FRAME_NODES_JS = """(ids) => {
  const c = app.canvas, r = c.canvas.getBoundingClientRect();
  let x0 = 1e9, y0 = 1e9, x1 = -1e9, y1 = -1e9;
  for (const n of app.graph._nodes) {
    if (ids.length && !ids.includes(String(n.id))) continue;
    x0 = Math.min(x0, n.pos[0]); y0 = Math.min(y0, n.pos[1] - LiteGraph.NODE_TITLE_HEIGHT);
    x1 = Math.max(x1, n.pos[0] + n.size[0]); y1 = Math.max(y1, n.pos[1] + n.size[1]);
  }
  const margin = 40, scale = Math.min(1.3, (r.width - 2 * margin) / (x1 - x0), (r.height - 2 * margin) / (y1 - y0));
  c.ds.scale = scale;
  c.ds.offset = [(r.width / scale - (x1 - x0)) / 2 - x0, (r.height / scale - (y1 - y0)) / 2 - y0];
  c.setDirty(true, true);
  return scale;
}"""


def _open_graph(page: Any, graph: Optional[dict], name: str) -> None:
    close_dialogs(page)
    page.evaluate("() => app.extensionManager.setting.set('Comfy.Minimap.Visible', false)")
    if graph is not None:
        page.evaluate("async ([g, n]) => { await app.loadGraphData(g, true, true, n); }", [graph, name])
    assert page.evaluate(RECORD_EVENTS_JS), "no ComfyUI api object in the page to listen on"


def _set_widgets(page: Any, node_type: str, values: dict[str, Any]) -> None:
    page.evaluate("""([type, values]) => {
      const n = app.graph._nodes.find(x => x.type === type);
      for (const [k, v] of Object.entries(values)) n.widgets.find(w => w.name === k).value = v;
    }""", [node_type, values])


def _node_id(page: Any, node_type: str) -> str:
    return str(page.evaluate("(t) => app.graph._nodes.find(n => n.type === t).id", node_type))


def _queue_from_page(page: Any) -> None:
    page.evaluate("async () => { await app.queuePrompt(0, 1); }")


def _assert_no_error(page: Any, what: str = "the prompt queued from the page") -> None:
    failed = [e for e in page.evaluate("() => window.__vllmEvents") if e[0] == "execution_error"]
    assert not failed, f"{what}: the prompt failed: {json.dumps(failed[-1][2])[:3000]}"


def _wait_view(page: Any, node_id: str, ok: Callable[[dict], bool], timeout: float, what: str,
               comfy: ComfyUI) -> dict:
    deadline = time.monotonic() + timeout
    view: dict = {}
    while time.monotonic() < deadline:
        view = page.evaluate(NODE_VIEW_JS, node_id) or {}
        if ok(view):
            return view
        _assert_no_error(page, what)
        page.wait_for_timeout(200)
    raise AssertionError(f"{what}: not shown within {timeout:.0f}s; the node shows {view}; "
                         f"events {[e[0] for e in page.evaluate('() => window.__vllmEvents')][-30:]}; "
                         f"ComfyUI log tail:\n{comfy.log()[-3000:]}")


def _wait_idle(comfy: ComfyUI, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not comfy.idle():
        assert time.monotonic() < deadline, f"ComfyUI still busy after {timeout:.0f}s"
        time.sleep(0.2)


DOCTOR_DONE = re.compile(r"\d+ problem\(s\), \d+ warning\(s\), \d+ check\(s\) could not run")
DOCTOR_VERDICT = re.compile(r"^(?:OK|FAIL): .{0,40}\n")     # the report's first line, short (the node's default size)


def check_text_nodes_in_browser(comfy: ComfyUI, png: Optional[Path] = None) -> dict:
    """Queue Doctor and Server Status from the page: their reports appear on the nodes in the front end,
    the Doctor's verdict first; with `png`, a screenshot of the nodes at their default size and zoom 1."""
    with browser_page(comfy.url) as (page, _console):
        _open_graph(page, None, "")
        ids = page.evaluate("""() => {
          app.graph.clear();
          const made = [];
          for (const [type, x] of [['VLLMOmniDoctor', 80], ['VLLMOmniServerStatus', 640]]) {
            const n = LiteGraph.createNode(type); n.pos = [x, 120]; app.graph.add(n); made.push(String(n.id));
          }
          return made;
        }""")
        _queue_from_page(page)
        doctor = _wait_view(page, ids[0], lambda v: any(DOCTOR_DONE.search(val or "") for _, val in v["widgets"]),
                            180, "Doctor's report on the Doctor node", comfy)
        status = _wait_view(page, ids[1], lambda v: bool(v.get("preview")), 60, "Server Status's report on its node",
                            comfy)
        _wait_idle(comfy, 60)
        texts = [e[2] for e in page.evaluate("() => window.__vllmEvents") if e[0] == "progress_text"]
        status = page.evaluate(NODE_VIEW_JS, ids[1])
        size = None
        if png is not None:
            page.evaluate("() => { const c = app.canvas; c.ds.scale = 1; c.ds.offset = [0, 0]; "
                          "c.setDirty(true, true); }")
            page.wait_for_timeout(300)
            size = save_png(page, png)
        node_size = page.evaluate("(id) => app.graph.getNodeById(id).size", ids[0])
    sent = [t["text"] for t in texts if str(t.get("nodeId")) == ids[1]]
    assert sent and status["preview"] == sent[-1], \
        f"Server Status shows {status['preview']!r}, not the last text ComfyUI sent for it ({sent[-1:]})"
    shown = next(val for _, val in doctor["widgets"] if DOCTOR_DONE.search(val or ""))
    assert DOCTOR_VERDICT.match(shown), f"the Doctor's report does not start with its verdict: {shown[:200]!r}"
    return {"doctor_text": shown, "doctor_verdict": shown.splitlines()[:2], "doctor_node_size": node_size,
            "server_status_text": status["preview"], "progress_text_events": len(texts),
            "screenshot": str(png) if png is not None else None, "png_bytes": size}


def screenshot_mid_launch(comfy: ComfyUI, logs: LauncherLogs, png: Path, timeout: float = 300.0) -> dict:
    """The TI2V template queued from the page while the stub is loading weights: the Local Server
    node shows status text and a progress bar; screenshot; then Cancel."""
    graph = json.loads((WORKFLOWS / f"{TI2V_TEMPLATE}.json").read_text())
    with browser_page(comfy.url, width=1400, height=900) as (page, _console):
        _open_graph(page, graph, TI2V_TEMPLATE)
        local = _node_id(page, "VLLMOmniLocalServer")   # the template's own values: the job never starts
        loads_before = logs.loads()

        def still_launching() -> None:
            _assert_no_error(page)
            page.wait_for_timeout(500)

        _queue_from_page(page)
        logs.wait_new_load(loads_before, timeout, still_launching)
        view = _wait_view(page, local, lambda v: bool(v.get("preview")), 30, "Local Server's status text", comfy)
        page.wait_for_timeout(2500)          # the next status updates; the canvas redraws
        view = page.evaluate(NODE_VIEW_JS, local)
        bars = page.evaluate(PROGRESS_OF_JS, local)
        page.evaluate(FRAME_NODES_JS, [])
        page.wait_for_timeout(500)
        size = save_png(page, png)
        comfy.interrupt()
        _wait_idle(comfy, 120)
    assert view.get("preview"), f"Local Server shows no status text mid-launch: {view}"
    assert bars, f"Local Server got no progress (progress / progress_state events) during the launch; text: {view['preview']!r}"
    return {"screenshot": str(png), "png_bytes": size, "text": view["preview"], "progress": bars[-3:]}


STEP_TEXT = re.compile(r"Step (\d+)/(\d+)")


def screenshot_mid_denoise(comfy: ComfyUI, png: Path, steps: int = 20, timeout: float = 600.0) -> dict:
    """The TI2V template (small size, ``steps`` steps) queued from the page: mid-denoise, Generate
    shows 'Step k/N' and a progress bar; screenshot; the prompt then completes."""
    graph = json.loads((WORKFLOWS / f"{TI2V_TEMPLATE}.json").read_text())
    with browser_page(comfy.url, width=1400, height=900) as (page, _console):
        _open_graph(page, graph, TI2V_TEMPLATE)
        gen = _node_id(page, "VLLMOmniGenerateVideo")
        _set_widgets(page, "VLLMOmniGenerateVideo", {"width": 320, "height": 192, "frames": 17, "steps": steps,
                                                     "seed": 500000 + int(time.time()) % 100000})
        _queue_from_page(page)

        def mid(view: dict) -> bool:
            m = STEP_TEXT.search(view.get("preview") or "")
            return bool(m) and int(m.group(2)) // 4 <= int(m.group(1)) < int(m.group(2)) - 2
        view = _wait_view(page, gen, mid, timeout, f"Generate's 'Step k/{steps}' text mid-denoise", comfy)
        bars = page.evaluate(PROGRESS_OF_JS, gen)
        page.evaluate(FRAME_NODES_JS, [])
        page.wait_for_timeout(300)
        size = save_png(page, png)
        done = _wait_view(page, gen, lambda v: (v.get("preview") or "").startswith("Done"), timeout,
                          "Generate's 'Done' text", comfy)
        _wait_idle(comfy, 60)
    assert bars and any(0 < value < total for value, total in bars), \
        f"Generate's progress bar did not move mid-denoise: {bars}"
    return {"screenshot": str(png), "png_bytes": size, "text": view["preview"], "progress": bars[-3:],
            "done": done["preview"]}

