"""The GPU bench as one tool: `python -m bench.gpu <phase>` (see __main__.py for the phases).

Phases run where their python is: `manifest` here on CPU (server venv / ComfyUI's python), `weights` on the
device with the image's python (torch + safetensors), `detect` and `native` under ComfyUI's python, `calibrate`
and `levers` under the server venv's python; the earlier bench/ scripts by name. `common.py` holds what they
all share and imports none of them. Nothing here is imported by the package.
"""
