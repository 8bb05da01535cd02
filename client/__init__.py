"""Talking to a running vLLM-Omni server: the /v1/videos HTTP client and MP4 frame decoding."""
