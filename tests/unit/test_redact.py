"""Secret names are masked and server-provided text cannot drive a terminal or reorder UI text."""
from __future__ import annotations

import random
import re

import pytest

from vllm_omni_launcher.errors.redact import is_secret_name, mask_env, mask_url_password, strip_control


@pytest.mark.parametrize("name", ["HF_TOKEN", "hf_token", "VLLM_API_KEY", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "MYSQL_PASSWD"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["HF_HOME", "CUDA_VISIBLE_DEVICES", "PATH", "HF_HUB_OFFLINE"])
def test_plain_names(name: str) -> None:
    assert not is_secret_name(name)


def test_mask_env_masks_secret_values_and_url_passwords() -> None:
    masked = mask_env({"HF_TOKEN": "hf_x", "HF_HOME": "/data", "HTTPS_PROXY": "http://me:pw@proxy:3128"})
    assert masked == {"HF_TOKEN": "***", "HF_HOME": "/data", "HTTPS_PROXY": "http://me:***@proxy:3128"}


def test_mask_url_password_leaves_plain_urls() -> None:
    assert mask_url_password("see http://gpu-box:8091/v1 and https://u@h") == "see http://gpu-box:8091/v1 and https://u@h"


@pytest.mark.parametrize("raw, clean", [
    ("\x1b[31mred\x1b[0m text", "red text"),                          # colours
    ("job\x1b[2J\x1b[H id", "job id"),                                # clear screen, cursor home
    ("\x1b]0;pwned title\x07ok", "ok"),                               # OSC window title
    ("\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\", "link"),          # OSC 8 hyperlink
    ("a\rb\x08c\x00d\x7fe\x9b31mf", "abcdef"),                         # CR, backspace, NUL, DEL, 8-bit CSI
    ("line 1\n\tline 2", "line 1\n\tline 2"),                         # newline and tab kept
    ("abc\u202edcb", "abcdcb"),                                       # bidi override
    ("ünïcödé 视频", "ünïcödé 视频"),
])
def test_strip_control(raw: str, clean: str) -> None:
    assert strip_control(raw) == clean


# The pattern before it was made linear: the reference its results must equal.
_QUADRATIC = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^@\s/]*@")


@pytest.mark.parametrize("text, masked", [
    ("a" * 200_000, "a" * 200_000),                                              # one long scheme-like run
    ("a1" * 100_000 + " http://u:pw@h", "a1" * 100_000 + " http://u:***@h"),     # digits give no new start
    ("x" * 100_000 + "://u:" + "p" * 100_000 + "@h", "x" * 100_000 + "://u:***@h"),
    ("a://" + "x:" * 100_000, "a://" + "x:" * 100_000),                          # a password that never ends
    ("http://a:b@c/ " * 15_000, "http://a:***@c/ " * 15_000),
])
def test_mask_url_password_handles_200k_characters(text: str, masked: str) -> None:
    assert mask_url_password(text) == masked


def test_mask_url_password_masks_what_the_old_pattern_masked() -> None:
    rng = random.Random(7)
    for _ in range(20_000):
        text = "".join(rng.choice("ab1+.:/@ -") for _ in range(rng.randint(0, 24)))
        assert mask_url_password(text) == _QUADRATIC.sub(r"\g<head>:***@", text), text
    for text in ("1http://u:p@h", "+http://u:p@h", "x.y+z://u:p@h", "123://u:p@h", "see ftp://me:pw@h:21/x"):
        assert mask_url_password(text) == _QUADRATIC.sub(r"\g<head>:***@", text)
