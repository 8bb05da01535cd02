"""What a launch is, before any process runs: the `LaunchSpec` (`spec.py`), its sections and their
flags (`sections.py`), the rules that refuse a spec (`spec_rules.py`), its flag tables
and extra-flag check (`flags.py`), the vLLM/vLLM-Omni versions (`versions.py`), LoRAs (`loras.py`,
`lora_files.py`), the replica layout (`replicas.py`) and the model's weights on disk
(`hf_cache.py`). Imports only logs/, storage/, config/ and the layers below server/.
"""
