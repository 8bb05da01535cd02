"""Which inputs a model takes: one rule for the nodes and the command line, checked before any input is
read or encoded.

A start image goes to I2V-A14B (required), TI2V-5B (optional) and S2V-14B (the portrait, required); a
control video or reference images to VACE, never both (upstream answers 400 'does not support mixed
image and video references'); audio to S2V (required). Anything else would be dropped silently or
fail the job late (docs/wan-pipelines.md). The rule speaks of inputs by their setting names; each
surface passes its own words for them (`InputWords`): the nodes' are `NODE_WORDS`, the command line
passes its options ("--image", "--reference-image") and how it names a model (`--model HF_ID`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection, Mapping

from ..errors import LauncherError
from .families import FAMILIES, PIPELINE_FAMILIES, WanFamily

INPUTS = ("image", "control_video", "reference_images", "audio")
_VACE_INPUTS = ("control_video", "reference_images")


@dataclass(frozen=True)
class InputWords:
    """How a surface names the inputs and the models in its error text."""

    names: Mapping[str, str]         # setting -> the surface's name ("image" -> "--image")
    give: Mapping[str, str]          # setting -> how to give it ("pass --image PATH (a PNG or JPEG)")
    drop: str                        # how to leave one out, with {name}
    use: str                         # how to pick other models, with {models}
    model: Callable[[WanFamily], str]   # one model as `use` names it


NODE_WORDS = InputWords(
    names={name: name for name in INPUTS},
    give={"image": "connect an IMAGE to the 'image' input",
          "control_video": "connect an IMAGE batch (e.g. Load Video's frames) to 'control_video'",
          "reference_images": "connect an IMAGE batch to 'reference_images'",
          "audio": "connect an AUDIO (e.g. Load Audio) to the 'audio' input"},
    drop="disconnect '{name}'", use="load {models}", model=lambda family: family.label)


def inputs_taken(family: WanFamily) -> dict[str, bool]:
    """{input: whether it is required} for every input `family` takes."""
    taken = {} if family.image_input == "none" else {"image": family.image_input == "required"}
    if family.pipeline == "vace":
        taken.update(dict.fromkeys(_VACE_INPUTS, False))
    if family.pipeline == "s2v":
        taken["audio"] = True
    return taken


def check_inputs(family: WanFamily, given: Collection[str], words: InputWords = NODE_WORDS,
                 known: Collection[str] = INPUTS, references: int = 0) -> None:
    """Refuse `given` (the inputs present) where `family` cannot take one, takes two that exclude each
    other, or misses a required one among `known` (the inputs whose presence the caller knows);
    `references`: how many reference images, capped by client/media.py's one check."""
    taken = inputs_taken(family)
    for name in INPUTS:
        if name in given and name not in taken:
            raise _not_taken(family, name, words)
    if all(name in given for name in _VACE_INPUTS):
        first, second = (words.names[n] for n in _VACE_INPUTS)
        raise LauncherError(
            f"The request has both {first} and {second}", "vLLM-Omni takes one image or one video per request "
            "for Wan (it answers 400 'does not support mixed image and video references')",
            f"{words.drop.format(name=second)} or {words.drop.format(name=first)}", setting=second)
    if references:
        from ..client.media import check_reference_count   # lazy: numpy, as for the other media checks

        check_reference_count(references, words.names["reference_images"])
    for name, required in taken.items():
        if required and name in known and name not in given:
            raise _missing(family, name, words)


def _models(words: InputWords, families: list[WanFamily]) -> str:
    return words.use.format(models=" or ".join(words.model(f) for f in families))


def _not_taken(family: WanFamily, name: str, words: InputWords) -> LauncherError:
    pool = FAMILIES if name == "image" else PIPELINE_FAMILIES
    others = [f for f in pool.values() if name in inputs_taken(f)]
    if name != "image":
        why = "only VACE models take a control video or reference images, and only S2V takes audio"
    elif family.pipeline == "vace":
        why = "VACE follows a control video or reference images; a start image would be dropped silently"
    else:
        why = "it runs text-to-video only, so the image would be dropped silently"
    fix = f"{words.drop.format(name=words.names[name])}, or {_models(words, others)}"
    if name == "image" and family.pipeline == "vace":
        fix += f", or give the image as {words.names['reference_images']}"
    return LauncherError(f"{family.label} does not take {words.names[name]}", why, fix, setting=words.names[name])


def _missing(family: WanFamily, name: str, words: InputWords) -> LauncherError:
    give, setting = words.give[name], words.names[name]
    if name == "audio":
        return LauncherError(f"{family.label} needs audio", "speech-to-video follows the audio (upstream fails the "
                             "job with 'No audio provided')", give, setting=setting)
    if family.pipeline == "s2v":
        return LauncherError(f"{family.label} needs a reference image", "speech-to-video animates the person in "
                             "one image; upstream fails the job with 'No reference image provided'",
                             f"{give} (the face or portrait)", setting=setting)
    text_only = [f for f in FAMILIES.values() if not inputs_taken(f).get("image")]
    return LauncherError(f"{family.label} needs a start image", "it is an image-to-video model; upstream fails the "
                         "job with 'No image is provided'", f"{give}, or {_models(words, text_only)} for text-only "
                         "video", setting=setting)
