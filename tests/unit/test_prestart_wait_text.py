"""What a launch shows while another start holds the registry's start lock (nodes/prestart_wait.py): during
`prestart_last_server`'s start, that it waits for that server and whether it will use it or start its own;
otherwise, that it waits for another start. The prestart's own launch never says it waits for itself."""
from __future__ import annotations

import re
import threading

from vllm_omni_launcher.nodes import prestart_wait

OURS, OTHER = "fingerprint-a", "fingerprint-b"
PREFIX = (r"Waiting for the server prestart_last_server is starting \(started \d+ s ago, when ComfyUI loaded the "
          r"pack\): ")


def _from_another_thread(fingerprint: str) -> str:
    out: list[str] = []
    node = threading.Thread(target=lambda: out.append(prestart_wait.waiting_text(fingerprint)))
    node.start()
    node.join()
    return out[0]


def test_during_the_prestart_a_node_asking_for_its_server_says_it_will_use_it():
    with prestart_wait.running():
        prestart_wait.planned(OURS)
        assert re.fullmatch(PREFIX + "this node uses that server once it is ready", _from_another_thread(OURS))


def test_during_the_prestart_a_node_asking_for_another_server_says_it_will_start_its_own():
    with prestart_wait.running():
        prestart_wait.planned(OURS)
        assert re.fullmatch(PREFIX + r"this node asks for a different server \(its choices differ from the recorded "
                            r"ones\), so it starts its own once that start ends, stopping that one where they share "
                            "GPUs", _from_another_thread(OTHER))


def test_outside_a_prestart_and_on_the_prestarts_own_thread_the_wait_is_for_another_start():
    another = "Waiting for another server start in this ComfyUI to finish; this launch goes on after it"
    assert prestart_wait.waiting_text(OURS) == another
    with prestart_wait.running():
        prestart_wait.planned(OURS)
        assert prestart_wait.waiting_text(OURS) == another
    assert _from_another_thread(OURS) == another, "the prestart has ended"
