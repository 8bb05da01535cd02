"""Reading a server's log: following it as it grows (`log_follower.py`), its startup phases and
denoise progress (`logwatch.py`), and why a server failed, in the user's words (`failures.py`).
Imports only storage/, config/ and the layers below server/.
"""
