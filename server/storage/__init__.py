"""The launcher's own files under its data dir: private (0600/0700), never through a link, a full
disk said in words (`private_files.py`), and the state file a left-behind server is found by
(`state_file.py`). Imports only config/ and the layers below server/.
"""
