"""ComfyUI nodes (V1 API): a thin layer over server/, client/ and planner/."""
NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}
