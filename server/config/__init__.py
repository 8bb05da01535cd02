"""The local configuration and the server's program: what only the machine's owner decides.

The settings (`settings.py` declares each once; `local_config.py` reads the file and the
environment, `config_values.py` converts raw values, `remote_servers.py` the remote servers and
their keys), the server program and its environment (`server_env.py`, `environment.py`), and the
platform check. The bottom of server/: it imports only models, client/ and errors/.
"""
