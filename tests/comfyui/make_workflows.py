"""(Re)build the shipped templates in ``workflows/`` with ComfyUI's own front end.

Each template is described below by node types, widget values *by name* and links. The
script starts a real ComfyUI with this pack (``COMFYUI_DIR``), creates every node in the
browser with ``LiteGraph.createNode``, sets the widgets, connects the links, then writes:

* ``workflows/<name>.json``          what the front end's Export writes (``app.graphToPrompt().workflow``
                                     plus the view; UI format 0.4, positional ``widgets_values``);
* ``workflows/api/<name>.api.json``  what Export (API) writes (``app.graphToPrompt().output``).

The API twins live in ``workflows/api/`` because ComfyUI lists every ``workflows/*.json`` as
a template, and an API-format file is not a graph the editor can open.

Usage::

    COMFYUI_DIR=/path/to/ComfyUI python tests/comfyui/make_workflows.py [--python PY]

The output is deterministic (same files for the same node definitions and front end).
Then review the diff, refresh the screenshots and card thumbnails with
``run_real_comfyui.py --screenshots docs/screenshots --thumbnails``, and when a template is
released copy it to ``tests/unit/released_workflows/`` (``--freeze``): that frozen copy must
keep loading with every later version of the nodes (tests/unit/test_workflows.py).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comfy_harness import (LOAD_AND_INSPECT_JS, WORKFLOWS, browser_page, put_media_inputs,  # noqa: E402
                           running_comfyui)
from template_specs import READABLE_ZOOM, TEMPLATES  # noqa: E402

RELEASED = Path(__file__).resolve().parents[1] / "unit" / "released_workflows"

BUILD_JS = """async ([spec, name, wid, READABLE_ZOOM]) => {
  const g = app.graph;
  await app.loadGraphData({last_node_id: 0, last_link_id: 0, nodes: [], links: [], groups: [], config: {},
                           extra: {}, version: 0.4}, true, false, name);
  const byKey = {};
  for (const d of spec.nodes) {
    const n = LiteGraph.createNode(d.type);
    if (!n) throw new Error('unknown node type ' + d.type);
    g.add(n);
    n.pos = d.pos;
    for (const [wname, value] of Object.entries(d.widgets)) {
      const w = (n.widgets || []).find(x => x.name === wname);
      if (!w) throw new Error(d.type + ' has no widget ' + wname);
      w.value = value;
    }
    const min = n.computeSize();
    n.size = [Math.max(d.size[0], min[0]), Math.max(d.size[1], min[1])];
    byKey[d.key] = n;
  }
  for (const [src, out, dst, inp] of spec.links) {
    const a = byKey[src], b = byKey[dst];
    const o = a.findOutputSlot(out), i = b.findInputSlot(inp);
    if (o < 0 || i < 0) throw new Error('bad link ' + [src, out, dst, inp]);
    if (!a.connect(o, b, i)) throw new Error('link refused ' + [src, out, dst, inp]);
  }
  // Fit the whole graph in the saved view.
  let x0 = 1e9, y0 = 1e9, x1 = -1e9, y1 = -1e9;
  for (const n of g._nodes) {
    x0 = Math.min(x0, n.pos[0]); y0 = Math.min(y0, n.pos[1] - LiteGraph.NODE_TITLE_HEIGHT);
    x1 = Math.max(x1, n.pos[0] + n.size[0]); y1 = Math.max(y1, n.pos[1] + n.size[1]);
  }
  app.canvas.ds.fitToBounds([x0 - 20, y0 - 20, x1 - x0 + 40, y1 - y0 + 40], {zoom: 0.92});
  // Below about 0.57 (8 px of a 14 px font) the front end draws nodes without their text: a wide
  // graph then opens as blank boxes. So the view never zooms out past READABLE_ZOOM; the graph's
  // top-left corner (the Note) is in view, below the menu and tabs that cover the canvas's top
  // (about 80 px), and the rest is a pan away.
  if (app.canvas.ds.scale < READABLE_ZOOM) {
    app.canvas.ds.scale = READABLE_ZOOM;
    app.canvas.ds.offset = [20 - x0, 90 / READABLE_ZOOM - y0];
  }
  app.canvas.setDirty(true, true);
  // What the menu's Export and Export (API) write: graphToPrompt() plus the view (addViewRestore).
  const prompt = await app.graphToPrompt();
  const ui = prompt.workflow;
  ui.id = wid;
  ui.extra = ui.extra || {};
  ui.extra.ds = {scale: app.canvas.ds.scale, offset: [app.canvas.ds.offset[0], app.canvas.ds.offset[1]]};
  return {ui: JSON.stringify(ui), api: JSON.stringify(prompt.output)};
}"""


def _round_ds(ui: dict) -> None:
    ds = ui.get("extra", {}).get("ds")
    if ds:
        ds["scale"] = round(ds["scale"], 4)
        ds["offset"] = [round(v, 2) for v in ds["offset"]]


def build(comfy_dir: Path, python: str, names: list[str]) -> list[Path]:
    written = []
    with running_comfyui(comfy_dir, python, {}) as comfy, browser_page(comfy.url) as (page, console):
        put_media_inputs(comfy.base / "input")     # as a user's input folder: the loaders' previews load
        for name in names:
            wid = str(uuid.uuid5(uuid.NAMESPACE_URL, "vllm-omni-launcher/workflows/" + name))
            out = page.evaluate(BUILD_JS, [TEMPLATES[name], name, wid, READABLE_ZOOM])
            ui, api = json.loads(out["ui"]), json.loads(out["api"])
            if any(n["type"] == "LoadVideo" for n in TEMPLATES[name]["nodes"]):
                # Load Video adds its preview widget (sent in the prompt) only when a graph is loaded with
                # the file present: export what the template gives once loaded, as a user's Export would.
                api = page.evaluate(LOAD_AND_INSPECT_JS, [ui, name])["api"]
            _round_ds(ui)
            ui_path = WORKFLOWS / f"{name}.json"
            api_path = WORKFLOWS / "api" / f"{name}.api.json"
            api_path.parent.mkdir(parents=True, exist_ok=True)
            ui_path.write_text(json.dumps(ui, indent=2, ensure_ascii=False) + "\n")
            api_path.write_text(json.dumps(api, indent=2, ensure_ascii=False) + "\n")
            written += [ui_path, api_path]
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="templates to build (default: all)")
    ap.add_argument("--comfyui-dir", default=os.environ.get("COMFYUI_DIR"))
    ap.add_argument("--python", default=os.environ.get("COMFYUI_PYTHON", sys.executable),
                    help="the python of ComfyUI's environment")
    ap.add_argument("--freeze", action="store_true",
                    help="copy the current workflows into tests/unit/released_workflows (at a release)")
    args = ap.parse_args()
    if args.freeze:
        RELEASED.mkdir(parents=True, exist_ok=True)
        for path in sorted(WORKFLOWS.glob("*.json")) + sorted((WORKFLOWS / "api").glob("*.api.json")):
            shutil.copy2(path, RELEASED / path.name)
            print("froze", path.name)
        return 0
    if not args.comfyui_dir:
        ap.error("set COMFYUI_DIR or --comfyui-dir")
    names = args.names or list(TEMPLATES)
    for path in build(Path(args.comfyui_dir), args.python, names):
        print("wrote", path.relative_to(WORKFLOWS.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
