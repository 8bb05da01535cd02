"""`python -m vllm_omni_launcher ...`: the command line (argv, serve, generate, plan, doctor)."""
from .cli import main

raise SystemExit(main())
