"""Which inputs a model takes is one rule (models/inputs.py), which the nodes and the command line both call
before any input is read or encoded, each naming the inputs and the models in its own words."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipeline_media import portrait, refused
from vllm_omni_launcher.cli.generate_cmd import CLI_WORDS
from vllm_omni_launcher.client import media
from vllm_omni_launcher.errors import LauncherError
from vllm_omni_launcher.models import (ALL_FAMILIES, FAMILIES, NODE_WORDS, PIPELINE_FAMILIES, check_inputs,
                                       inputs_taken, request_for)

INPUTS = ("image", "control_video", "reference_images", "audio")
T2V, I2V, TI2V = FAMILIES["t2v_a14b"], FAMILIES["i2v_a14b"], FAMILIES["ti2v_5b"]
VACE, S2V = PIPELINE_FAMILIES["vace_1_3b"], PIPELINE_FAMILIES["s2v_14b"]


def test_what_each_family_takes():
    assert inputs_taken(T2V) == {} and inputs_taken(I2V) == {"image": True} and inputs_taken(TI2V) == {"image": False}
    assert inputs_taken(VACE) == inputs_taken(PIPELINE_FAMILIES["vace_14b"]) == {"control_video": False,
                                                                               "reference_images": False}
    assert inputs_taken(S2V) == {"image": True, "audio": True}
    assert inputs_taken(PIPELINE_FAMILIES["fastwan_ti2v_5b"]) == {}


@pytest.mark.parametrize("family", list(ALL_FAMILIES.values()), ids=list(ALL_FAMILIES))
def test_the_nodes_and_the_command_line_get_the_same_answer_for_every_set_of_inputs(family):
    for count in range(len(INPUTS) + 1):
        for given in itertools.combinations(INPUTS, count):
            answers = []
            for words in (NODE_WORDS, CLI_WORDS):
                try:
                    check_inputs(family, given, words)
                    answers.append(None)
                except LauncherError as exc:
                    setting = next(n for n in INPUTS if words.names[n] == exc.setting)
                    answers.append((setting, exc.why))
                    assert words.names[setting] in exc.what + exc.fix, (family.key, given, str(exc))
            assert answers[0] == answers[1], (family.key, given)
            taken = inputs_taken(family)
            fine = all(n in taken for n in given) and not {"control_video", "reference_images"} <= set(given) \
                and all(n in given for n, required in taken.items() if required)
            assert (answers[0] is None) == fine, (family.key, given)


def test_the_command_line_names_its_options_and_the_models_to_use_instead():
    err = refused(lambda: check_inputs(T2V, ("audio",), CLI_WORDS))
    assert (err.what, err.fix) == ("Wan2.2 T2V-A14B does not take --audio",
                                   f"leave --audio out, or use --model {S2V.hf_id}")
    err = refused(lambda: check_inputs(VACE, ("image",), CLI_WORDS))
    assert err.fix == (f"leave --image out, or use --model {I2V.hf_id} or {TI2V.hf_id}, or give the image as "
                       "--reference-image")
    node = refused(lambda: check_inputs(VACE, ("image",)))
    assert node.fix == ("disconnect 'image', or load Wan2.2 I2V-A14B or Wan2.2 TI2V-5B, or give the image as "
                        "reference_images")


def test_the_core_refuses_an_image_for_text_to_video_in_the_nodes_words():
    err = refused(lambda: request_for(T2V, prompt="x", image=portrait()))
    assert (err.what, err.setting) == ("Wan2.2 T2V-A14B does not take image", "image")
    assert err.fix == "disconnect 'image', or load Wan2.2 I2V-A14B or Wan2.2 TI2V-5B"


def test_the_reference_cap_is_one_check_for_every_surface():
    assert refused(lambda: check_inputs(VACE, ("reference_images",), CLI_WORDS, references=5)).fix == \
        f"pass at most {media.MAX_REFERENCE_IMAGES} images as --reference-image"
    many = np.broadcast_to(np.zeros((1, 1, 1, 3), np.float32), (5, 64, 64, 3))
    assert refused(lambda: request_for(VACE, prompt="x", reference_images=many)).fix == \
        f"pass at most {media.MAX_REFERENCE_IMAGES} images as reference_images"
