"""Parametric jobs: one description, one job per parameter value, as DIRAC and gLite expand them.

DIRAC (its ``ParametricJob`` utility, the reference): ``Parameters`` is a list of values or a
number of jobs N. A number makes a sequence: ``ParameterStart`` (default 1), then each value
is the one before times ``ParameterFactor`` (default 1) plus ``ParameterStep`` (default 0), so
``Parameters = 3; ParameterStart = 5;`` gives 5, 5, 5. A value is written as Python writes it:
a sequence with a float start, step or factor is made of floats (1.0, 1.5, 2.0). Named
sequences (``Parameters.A = {...}``, or ``ParameterStart.A`` / ``ParameterStep.A`` /
``ParameterFactor.A`` counted by ``Parameters``) sit beside the default one; every sequence has
N values and job *i* takes value *i* of each. In every attribute, ``%s`` is the default
sequence's value, ``%(A)s`` sequence A's, and ``%n`` the job's index, zero-padded to the width
of the last index (00 … 10 for 11 jobs).

gLite (``JobType = "Parametric"``): a number ``Parameters`` is where the range stops (not
included): ``ParameterStart`` (default 0), ``ParameterStep`` (default 1), so ``Parameters = 6;
ParameterStep = 2;`` gives 0, 2, 4; ``_PARAM_`` is the value.

Where gridpilot reads a description differently from DIRAC on purpose, the jobs carry a warning
saying so (:attr:`Expansion.warnings`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optimizers.jobfields import PARAMETRIC, JobDescriptionError, Raw, show

#: Most jobs one parametric description may expand into, and most bytes of text they may
#: hold together (a 60 KB description times 10,000 jobs would take gigabytes).
MAX_PARAMETRIC_JOBS = 10_000
MAX_EXPANDED_BYTES = 16 * 1024 * 1024
#: Largest absolute value a numeric parameter may reach.
MAX_PARAMETER = 1e15
#: The default sequence's name (DIRAC's "0").
DEFAULT = ""

ParameterValue = str | int | float | list[Any]
_NAMED = re.compile(r"%\((\w+)\)s")


@dataclass(frozen=True)
class Expansion:
    """The values of each job, by sequence name (:data:`DEFAULT` for ``%s``)."""

    jobs: list[dict[str, ParameterValue]]
    warnings: list[str] = field(default_factory=list)

    def parameter(self, index: int) -> str:
        """Job ``index``'s value of the default sequence, as text."""
        return as_text(self.jobs[index][DEFAULT])


def expand(raw: Raw, glite: bool) -> Expansion | None:
    """The parameter values of a parametric description, or None for a single job."""
    if "Parameters" not in raw:
        for name in raw:
            if name.split(".")[0] in PARAMETRIC:
                label = raw[name][0]
                hint = (" (the number of jobs, or the values of the default sequence, as "
                        "DIRAC needs it)" if "." in name else " (a list of values or a number "
                        "of jobs)")
                raise JobDescriptionError(
                    f"{label} is only meaningful with Parameters{hint}", label)
        return None
    sequences = _sequences(raw)
    if glite:
        if len(sequences) > 1:
            label = raw[next(n for n in raw if "." in n)][0]
            raise JobDescriptionError(
                f"{label}: named parameter sequences are DIRAC's, and JobType = \"Parametric\" "
                "is gLite's: drop the JobType to use them", label)
        values, notes = _glite_values(raw)
        return Expansion([{DEFAULT: v} for v in values], notes)
    count = _count(raw, sequences)
    warnings: list[str] = []
    body = repr({k: v for k, v in raw.items() if k.split(".")[0] not in PARAMETRIC})
    columns = {seq: _dirac_values(raw, names, count, seq, warnings, body)
               for seq, names in sequences.items()}
    return Expansion([{seq: columns[seq][i] for seq in columns} for i in range(count)],
                     warnings)


def _sequences(raw: Raw) -> dict[str, dict[str, str]]:
    """The sequences named in ``raw``: sequence → {field (Parameters, ParameterStart, …) →
    its key in ``raw``}."""
    out: dict[str, dict[str, str]] = {DEFAULT: {}}
    for name in raw:
        head, _, seq = name.partition(".")
        if head in PARAMETRIC:
            out.setdefault(seq, {})[head] = name
    return out


def _count(raw: Raw, sequences: Mapping[str, Mapping[str, str]]) -> int:
    """N: the number given by ``Parameters``, or its list's length; every list of a named
    sequence must have as many values (DIRAC: "Different length of parameter vectors")."""
    label, value = raw["Parameters"]
    count = _length(label, value, named=False)
    for seq, names in sequences.items():
        if seq == DEFAULT:
            continue
        key = names.get("Parameters")
        if key is None:
            continue
        other_label, other = raw[key]
        length = _length(other_label, other, named=True)
        if length != count:
            raise JobDescriptionError(
                f"{other_label} has {length} values but {label} makes {count} jobs: every "
                "parameter sequence needs one value per job", other_label)
    return count


def _length(label: str, value: Any, *, named: bool) -> int:
    if isinstance(value, list):
        if not value:
            raise JobDescriptionError(f"{label} must not be an empty list", label)
        if len(value) > MAX_PARAMETRIC_JOBS:
            raise JobDescriptionError(
                f"{label} lists {len(value)} values; at most {MAX_PARAMETRIC_JOBS} jobs can be "
                "submitted at once", label)
        for i, item in enumerate(value):
            if not _parameter_item(item):
                raise JobDescriptionError(
                    f"{label} item {i} must be a string, a number or a list of them, got "
                    f"{show(item)}", label)
        return len(value)
    if named:
        raise JobDescriptionError(
            f"{label} must be a list of values (a named sequence counted by a number takes "
            "ParameterStart, ParameterStep and ParameterFactor), got " + show(value), label)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobDescriptionError(
            f"{label} must be a list of values or a positive number of jobs, got {show(value)}",
            label)
    if value > MAX_PARAMETRIC_JOBS:
        raise JobDescriptionError(
            f"{label} asks for {value} jobs; at most {MAX_PARAMETRIC_JOBS} jobs can be "
            "submitted at once", label)
    return value


def _parameter_item(item: Any) -> bool:
    if isinstance(item, list):
        return all(not isinstance(v, list) and _parameter_item(v) for v in item)
    return not isinstance(item, bool) and isinstance(item, str | int | float)


def _dirac_values(raw: Raw, names: Mapping[str, str], count: int, seq: str,
                  warnings: list[str], body: str) -> list[ParameterValue]:
    """The values of one sequence; ``body`` is the text of the rest of the description
    (a sequence whose values are all alike earns a warning only where it is used)."""
    if "Parameters" in names and isinstance(raw[names["Parameters"]][1], list):
        label, values = raw[names["Parameters"]]
        for name in ("ParameterStart", "ParameterStep", "ParameterFactor"):
            if name in names:
                warnings.append(f"{raw[names[name]][0]} is not used: {label} lists the values")
        spaced = next((v for v in values if isinstance(v, str) and re.search(r"\s", v)), None)
        if spaced is not None:
            warnings.append(f"{label}: the value {show(spaced)} keeps its spaces here (DIRAC "
                            "removes the spaces of listed parameter values)")
        return list(values)
    start = _number(raw, names.get("ParameterStart"), 1)
    step = _number(raw, names.get("ParameterStep"), 0)
    factor = _number(raw, names.get("ParameterFactor"), 1)
    # DIRAC: the first value takes the type of the step and factor (1 * 1.0 + 0 is 1.0).
    first: int | float = start * type(factor)(1) + type(step)(0)
    exact = [first]
    for _ in range(1, count):
        exact.append(exact[-1] * factor + step)
        if abs(exact[-1]) > MAX_PARAMETER:
            label = raw[names.get("ParameterFactor") or names.get("ParameterStep")
                        or "Parameters"][0]
            raise JobDescriptionError(
                f"{label} makes parameter {len(exact) - 1} exceed {MAX_PARAMETER:.0e}; use "
                "smaller values or fewer jobs", label)
    tidy = [_tidy(v) for v in exact]
    changed = next((i for i, (a, b) in enumerate(zip(exact, tidy, strict=True))
                    if as_text(a) != as_text(b)), None)
    if changed is not None:
        warnings.append(
            f"parameter {changed} is {as_text(tidy[changed])} here: DIRAC's arithmetic gives "
            f"{as_text(exact[changed])} (values are rounded to 12 significant digits)")
    placeholder = "%s" if seq == DEFAULT else f"%({seq})s"
    used = placeholder in body or (seq == DEFAULT and "_PARAM_" in body)
    if count > 1 and "ParameterStep" not in names and factor == 1 and used:
        label = raw[names.get("Parameters", "Parameters")][0]
        warnings.append(
            f"{label} = {count} with no ParameterStep{'.' + seq if seq else ''}: every job "
            f"gets the value {as_text(tidy[0])} for {placeholder} (DIRAC's step is 0 unless "
            "given; give ParameterStep = 1 for a count)")
    return list(tidy)


def _glite_values(raw: Raw) -> tuple[list[ParameterValue], list[str]]:
    label, value = raw["Parameters"]
    if isinstance(value, list):
        _length(label, value, named=False)
        return list(value), []
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise JobDescriptionError(
            f"{label} must be a list of values or the number where the range stops, got "
            f"{show(value)}", label)
    start = _number(raw, "ParameterStart" if "ParameterStart" in raw else None, 0)
    step = _number(raw, "ParameterStep" if "ParameterStep" in raw else None, 1)
    if step <= 0:
        step_label = raw["ParameterStep"][0]
        raise JobDescriptionError(f"{step_label} must be above 0 for a gLite range, got "
                                  f"{show(step)}", step_label)
    count = math.ceil((value - start) / step)
    if count < 1:
        raise JobDescriptionError(
            f"{label} = {show(value)} ends the range before ParameterStart = {show(start)}: no "
            "job would be made", label)
    if count > MAX_PARAMETRIC_JOBS:
        raise JobDescriptionError(
            f"{label} makes {count} jobs; at most {MAX_PARAMETRIC_JOBS} jobs can be submitted "
            "at once", label)
    values: list[ParameterValue] = [_tidy(start + i * step) for i in range(count)]
    warning = (f'JobType = "Parametric" is gLite\'s: {label} = {show(value)} is where the '
               f"range stops, so {count} jobs (DIRAC would make {show(value)})")
    return values, ([warning] if count != value else [])


def _number(raw: Raw, key: str | None, default: int | float) -> int | float:
    if key is None:
        return default
    label, value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise JobDescriptionError(f"{label} must be a number, got {show(value)}", label)
    return value


def _tidy(value: int | float) -> int | float:
    """A float parameter without the last-digit noise of binary arithmetic (0.1 * 3)."""
    return float(f"{value:.12g}") if isinstance(value, float) else value


def as_text(value: ParameterValue) -> str:
    """A parameter value as it is written into a text: Python's own spelling for numbers (as
    DIRAC writes them), ``{a,b}`` for a list."""
    if isinstance(value, list):
        return "{" + ",".join(as_text(v) for v in value) + "}"
    return value if isinstance(value, str) else repr(value)


# --- placeholders ----------------------------------------------------------------------------


def templated(raw: Raw) -> frozenset[str]:
    """The fields of ``raw`` that hold a placeholder (the others are the same in every job)."""
    return frozenset(name for name, (_label, value) in raw.items()
                     if name.split(".")[0] not in PARAMETRIC
                     and ("%" in repr(value) or "_PARAM_" in repr(value)))


def substitute(raw: Raw, values: Mapping[str, ParameterValue], index: int, count: int,
               fields: frozenset[str] | None = None) -> Raw:
    """``raw`` for job ``index`` of ``count``: every placeholder replaced in every field but
    the parametric ones (in ``fields`` only, when given: :func:`templated`)."""
    width = len(str(count - 1))
    out: Raw = {}
    for name, (label, value) in raw.items():
        if name.split(".")[0] in PARAMETRIC:
            continue
        if fields is not None and name not in fields:
            out[name] = (label, value)
            continue
        out[name] = (label, _replace(value, values, str(index).zfill(width), in_list=False))
    return out


def _replace(value: Any, values: Mapping[str, ParameterValue], index: str, *,
             in_list: bool) -> Any:
    if isinstance(value, str):
        whole = _whole_placeholder(value)
        taken = values.get(whole) if whole is not None else None
        if isinstance(taken, list):
            return list(taken)  # InputData = %(InputData)s takes the list itself
        return _replace_text(value, values, index, in_list=in_list)
    if isinstance(value, list):
        out: list[Any] = []
        for item in value:
            whole = _whole_placeholder(item) if isinstance(item, str) else None
            taken = values.get(whole) if whole is not None else None
            if isinstance(taken, list):
                out.extend(taken)  # a list parameter spliced into a list
            else:
                out.append(_replace(item, values, index, in_list=True))
        return out
    if isinstance(value, dict):
        return {k: _replace(v, values, index, in_list=in_list) for k, v in value.items()}
    return value


def _whole_placeholder(text: str) -> str | None:
    text = text.strip()
    if text in ("%s", "_PARAM_"):
        return DEFAULT
    m = _NAMED.fullmatch(text)
    return m.group(1) if m else None


def _replace_text(text: str, values: Mapping[str, ParameterValue], index: str, *,
                  in_list: bool) -> str:
    if "%" not in text and "_PARAM_" not in text:
        return text

    def written(value: ParameterValue) -> str:
        # In a list attribute DIRAC writes a list parameter's items without their braces.
        shown = as_text(value)
        return shown[1:-1] if in_list and isinstance(value, list) else shown

    default = written(values[DEFAULT]) if DEFAULT in values else None
    text = text.replace("%n", index)
    if default is not None:
        text = text.replace("%s", default).replace("_PARAM_", default)
    return _NAMED.sub(lambda m: written(values[m.group(1)]) if m.group(1) in values
                      else m.group(), text)
