"""The launcher: launch spec, local configuration and the supervisor of the vLLM-Omni server."""
