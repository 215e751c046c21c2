"""Rule rewards users expect out of the box: exact match, math answer check, format check.

Every reward function in Claw-R1 takes the seed system's five keyword arguments (``prompt_ids``,
``response_ids``, ``num_turns``, ``extra_fields``, ``dataset_fields``), so one function serves both the
compat port's ``/compute_reward`` and the ``clawr1 rewarder`` role. Rules read text, not ids: the
response from ``extra_fields["response_text"]`` (the rewarder fills it from the step) and the reference
from ``dataset_fields["ground_truth"]`` (or veRL's ``dataset_fields["reward_model"]["ground_truth"]``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

__all__ = ["exact_match", "format_check", "math_answer", "extract_answer", "normalize_answer"]

DEFAULT_FORMAT = r"<think>.*?</think>\s*<answer>.*?</answer>"
"""The R1-style layout ``format_check`` expects unless the dataset names its own pattern."""


def _mapping(fields: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = fields.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be an object, got {type(value).__name__}")
    return value


def response_text(fields: Mapping[str, Any]) -> str:
    text = _mapping(fields, "extra_fields").get("response_text")
    if not isinstance(text, str):
        raise ValueError("rule rewards read the response from extra_fields['response_text'] (a string); "
                         "the rewarder fills it from the step, /compute_reward callers must send it")
    return text


def ground_truth(fields: Mapping[str, Any]) -> str:
    dataset = _mapping(fields, "dataset_fields")
    value = dataset.get("ground_truth")
    if value is None and isinstance(dataset.get("reward_model"), Mapping):
        value = dataset["reward_model"].get("ground_truth")
    if value is None:
        raise ValueError("no ground truth: set dataset_fields['ground_truth'] (the step's metadata) "
                         "or veRL's dataset_fields['reward_model']['ground_truth']")
    return str(value)


def exact_match(**fields: Any) -> dict[str, Any]:
    """1.0 when the response equals the ground truth after trimming whitespace, else 0.0."""
    predicted = response_text(fields).strip()
    return {"score": float(predicted == ground_truth(fields).strip()), "pred": predicted}


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_GSM8K = re.compile(r"####\s*(.+?)\s*$", re.MULTILINE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?%?|-?\.\d+")


def _last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``, braces balanced (answers hold ``\\frac{1}{2}``)."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def extract_answer(text: str) -> str | None:
    """The final answer a response states: the last ``\\boxed{}``, else GSM8K's ``#### x``, else the
    last number in the text; None when there is none."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed
    marked: list[str] = _GSM8K.findall(text)
    if marked:
        return marked[-1]
    numbers: list[str] = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


_FRAC = re.compile(r"\\[dt]?frac\s*(?:\{([^{}]*)\}|(\d))\s*(?:\{([^{}]*)\}|(\d))")
_TEXT = re.compile(r"\\(?:text|mathrm|mbox)\s*\{([^{}]*)\}")


def normalize_answer(answer: str) -> str:
    """A canonical spelling: no TeX wrappers, spaces, ``$``, ``%``, thousands separators or trailing period;
    ``\\frac{a}{b}`` as ``a/b``; numbers as their exact reduced value (``0.50`` -> ``1/2``)."""
    text = _TEXT.sub(r"\1", answer)
    text = _FRAC.sub(_fraction, text)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\%", "%", "$", " ", "\n", "\t"):
        text = text.replace(token, "")
    text = text.rstrip(".").strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):
        text = text.replace(",", "")
    value = _exact(text)
    if value is None:
        return text.lower()
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _fraction(match: re.Match[str]) -> str:
    top, bottom = match.group(1) or match.group(2), match.group(3) or match.group(4)
    simple = all(re.fullmatch(r"-?[\d.]+", part.strip()) for part in (top, bottom))
    return f"{top}/{bottom}" if simple else f"({top})/({bottom})"


def _exact(text: str) -> Fraction | None:
    try:
        if "/" in text:
            top, bottom = text.split("/", 1)
            return Fraction(top) / Fraction(bottom)
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def math_answer(**fields: Any) -> dict[str, Any]:
    """1.0 when the response's final answer equals ``ground_truth`` as a number or normalized text.

    The ground truth may itself be a worked solution (GSM8K's ``#### 42``); both sides go through
    :func:`extract_answer` then :func:`normalize_answer`, so ``\\boxed{\\frac{1}{2}}`` matches ``0.5``.
    """
    truth_text = ground_truth(fields)
    worked = _last_boxed(truth_text) is not None or _GSM8K.search(truth_text) is not None
    truth = extract_answer(truth_text) if worked else truth_text
    predicted = extract_answer(response_text(fields))
    correct = predicted is not None and normalize_answer(predicted) == normalize_answer(truth or "")
    return {"score": float(correct), "pred": predicted, "acc": correct}


def format_check(**fields: Any) -> dict[str, Any]:
    """1.0 when the whole response matches the format pattern, else 0.0.

    The pattern is ``dataset_fields["format_pattern"]`` when the dataset gives one, else
    :data:`DEFAULT_FORMAT` (R1's ``<think>…</think><answer>…</answer>``); it must match the whole
    response (surrounding whitespace ignored), with ``.`` matching newlines.
    """
    pattern = _mapping(fields, "dataset_fields").get("format_pattern", DEFAULT_FORMAT)
    if not isinstance(pattern, str):
        raise ValueError(f"format_pattern must be a regular expression string, got {pattern!r}")
    matched = re.fullmatch(pattern, response_text(fields).strip(), flags=re.DOTALL) is not None
    return {"score": float(matched), "format_ok": matched}
