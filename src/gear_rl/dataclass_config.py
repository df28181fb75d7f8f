"""Configs written as nested dataclasses: the machinery behind ``gear-rl train``'s keys, shared by
the trainer's :class:`~gear_rl.train.config.TrainConfig`, the credit check and the studies.

- ``key=value`` overrides (:func:`parse_overrides`: values parsed as YAML scalars) and nested or
  dotted-key mappings (:func:`update_from_dict`: ``rollout.temperature=0.8`` sets a field of a
  section) applied to a config; a value keeps the field's type (:func:`coerce`), and an unknown
  key is an error that names the nearest valid one (:func:`settable_keys`).
- :func:`read_yaml`: a YAML file, with errors that name the file (and the line).
- :func:`field_docs` / :func:`field_default`: a field's description (its Google-style
  ``Attributes:`` entry, what ``--help`` prints) and its default.
- ``check_*``: a section's field checks, raising ``ValueError`` that names ``<prefix><field>``.

Nothing here knows a particular config: this module imports nothing from ``gear_rl``.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

__all__ = [
    "check_at_least",
    "check_finite",
    "check_one_of",
    "check_positive",
    "check_unit_interval",
    "coerce",
    "field_default",
    "field_docs",
    "nearest",
    "parse_overrides",
    "read_yaml",
    "settable_keys",
    "update_from_dict",
]

ConfigT = TypeVar("ConfigT")


def nearest(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate closest to ``word`` (``difflib``'s ratio at least ``cutoff``), or None."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=cutoff)
    return close[0] if close else None


# --- section checks ------------------------------------------------------------------------


def check_finite(prefix: str, section: Any) -> None:
    """Every float knob of ``section`` is finite: nan passes every ``>=`` rule and inf every
    ``>`` rule, and either would only surface as a broken run (``optim.lr=inf``)."""
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        hint = hints[f.name]
        if (float in (hint, *typing.get_args(hint)) and isinstance(value, float)
                and not math.isfinite(value)):
            raise ValueError(f"{prefix}{f.name} must be a finite number, got {value}")


def check_at_least(prefix: str, section: Any, minimum: int, *names: str) -> None:
    """Each of ``names`` (``None`` where the field allows it) is ``>= minimum``."""
    for name in names:
        value = getattr(section, name)
        if value is not None and value < minimum:
            raise ValueError(f"{prefix}{name} must be >= {minimum}, got {value}")


def check_positive(prefix: str, section: Any, *names: str) -> None:
    """Each of ``names`` is ``> 0``."""
    for name in names:
        value = getattr(section, name)
        if not value > 0:
            raise ValueError(f"{prefix}{name} must be > 0, got {value}")


def check_unit_interval(prefix: str, section: Any, *names: str) -> None:
    """Each of ``names`` is in ``(0, 1]`` (a nucleus mass, a fraction)."""
    for name in names:
        value = getattr(section, name)
        if not 0 < value <= 1:
            raise ValueError(f"{prefix}{name} must be in (0, 1], got {value}")


def check_one_of(key: str, value: Any, allowed: Sequence[str]) -> None:
    """``value`` is one of ``allowed``; the error names ``key`` and the nearest allowed value."""
    if value not in allowed:
        guess = nearest(str(value), allowed)
        hint = f"; did you mean {guess!r}?" if guess else ""
        raise ValueError(f"{key} must be one of {tuple(allowed)}, got {value!r}{hint}")


# --- keys, overrides, coercion -------------------------------------------------------------


def _is_mapping(hint: Any) -> bool:
    """A dict-valued field: its keys are free (``credit.<key>``), not fields of a section."""
    return hint is dict or typing.get_origin(hint) is dict


def settable_keys(cls: type, prefix: str = "", depth: int | None = None) -> list[str]:
    """Every settable dotted key of dataclass ``cls`` (dict-valued fields as ``name.<key>``);
    with ``depth=1``, sections as ``name.<key>`` too."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint) and depth == 1:
            keys.append(prefix + f.name + ".<key>")
        elif dataclasses.is_dataclass(hint):
            keys.extend(settable_keys(typing.cast(type, hint), prefix + f.name + ".",
                                      None if depth is None else depth - 1))
        elif _is_mapping(hint):
            keys.append(prefix + f.name + ".<key>")
        else:
            keys.append(prefix + f.name)
    return keys


def coerce(key: str, value: Any, hint: Any) -> Any:
    """``value`` checked (and, for numbers given as strings, converted) against ``hint``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(key, value, option)
            except ValueError as error:
                errors.append(str(error))
        raise ValueError(errors[0] if errors else f"{key}: bad value {value!r}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{key} must be a bool, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"{key} must be an int, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{key} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"{key} must be a string, got {value!r}")
    if origin is list or hint is list:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key} must be a list of strings, got {value!r}")
        return list(value)
    if _is_mapping(hint):
        if not isinstance(value, Mapping):
            raise ValueError(f"{key} must be a mapping, got {value!r}")
        return dict(value)
    return value


class _Setter:
    """Sets dotted keys on the config ``root``; ``help_pointer`` ends the errors that list keys
    (where the user finds every key described)."""

    def __init__(self, root: Any, help_pointer: str) -> None:
        self.root = root
        self.pointer = f" ({help_pointer})" if help_pointer else ""

    def set(self, config: Any, key: str, value: Any, full_key: str) -> None:
        name, _, rest = key.partition(".")
        fields = {f.name: f for f in dataclasses.fields(config)}
        if name not in fields:
            raise self.unknown_key(full_key, full_key[:len(full_key) - len(key)], config)
        hint = typing.get_type_hints(type(config))[name]
        if dataclasses.is_dataclass(hint):
            if rest:
                self.set(getattr(config, name), rest, value, full_key)
                return
            if not isinstance(value, Mapping):
                raise ValueError(f"{full_key} is a section; set its keys ({full_key}.<key>=...)")
            for sub, sub_value in value.items():
                self.set(getattr(config, name), str(sub), sub_value, f"{full_key}.{sub}")
            return
        if _is_mapping(hint) and rest:
            target = getattr(config, name)
            *parents, leaf = rest.split(".")
            for parent in parents:
                target = target.setdefault(parent, {})
            target[leaf] = value
            return
        if rest:
            raise ValueError(f"unknown config key {full_key!r}: {name!r} has no sub-keys"
                             f"{self.pointer}")
        setattr(config, name, coerce(full_key, value, hint))

    def unknown_key(self, full_key: str, prefix: str, config: Any) -> ValueError:
        """The error for ``full_key``, whose part after ``prefix`` is no field of ``config``: it
        names the nearest valid key (a typo, or the right name in another section), else the
        keys valid at that level."""
        keys = [key for key in settable_keys(type(self.root)) if not key.endswith(".<key>")]
        leaf = full_key.rsplit(".", 1)[-1]
        same_leaf = [key for key in keys if key.rsplit(".", 1)[-1] == leaf]
        if same_leaf:  # the right name in a misspelt, missing or wrong section
            close = nearest(full_key, same_leaf, cutoff=0.85)
            guesses = [close] if close else same_leaf
        else:  # a typo in the name (or in the section and the name)
            name = full_key[len(prefix):].split(".", 1)[0]
            close = (nearest(full_key, keys, cutoff=0.8)
                     or nearest(name, [prefix + f.name for f in dataclasses.fields(config)]))
            guesses = [close] if close else []
        if guesses:
            options = " or ".join(repr(key) for key in guesses)
            return ValueError(f"unknown config key {full_key!r}; did you mean {options}?")
        here = settable_keys(type(config), prefix, depth=1)
        where = f"{prefix[:-1]} keys" if prefix else "top-level keys"
        return ValueError(f"unknown config key {full_key!r}; valid {where}: {', '.join(here)}"
                          f"{self.pointer}")


def update_from_dict(config: ConfigT, data: Mapping[str, Any], *, help_pointer: str = ""
                     ) -> ConfigT:
    """Set the keys of nested (or dotted-key) mapping ``data`` on dataclass ``config`` (in place)
    and return it. A value keeps its field's type (:func:`coerce`); a dict-valued field takes
    free sub-keys; an unknown key raises naming the nearest valid key of ``config``, and the
    errors that list keys end with ``help_pointer``."""
    if not isinstance(data, Mapping):
        raise ValueError(f"config must be a mapping, got {type(data).__name__}")
    setter = _Setter(config, help_pointer)
    for key, value in data.items():
        setter.set(config, str(key), value, str(key))
    return config


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a.b": 1, "c": "x"}``; values are parsed as YAML scalars
    (``1e-5`` -> float, ``true`` -> bool, ``null`` -> None, ``[1, 2]`` -> list)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} is not of the form key=value")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str) and _looks_like_float(raw):
            value = float(raw)
        out[key.strip()] = value
    return out


def _looks_like_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_yaml(path: str | Path, what: str = "config file") -> Any:
    """The YAML document at ``path`` (None for an empty file); a missing file, invalid YAML (with
    its line) or a file that is not UTF-8 raises ``ValueError`` naming ``what`` and the path."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} does not exist")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ValueError(f"{what} {str(path)!r} is not valid YAML{line}: "
                         f"{getattr(error, 'problem', None) or error}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{what} {str(path)!r} is not UTF-8 text (byte "
                         f"{error.start})") from None


# --- field descriptions --------------------------------------------------------------------


def field_default(f: dataclasses.Field) -> Any:
    """The default value of dataclass field ``f`` (``default_factory`` called)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


_ENTRY = re.compile(r"(\w+)(?: \([^)]*\))?: (.*)")


def field_docs(cls: type) -> dict[str, str]:
    """``{field: description}`` for every field of dataclass ``cls``, from the ``Attributes:``
    sections of its docstring and its bases' (a subclass's entry wins; "" where none)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        docs.update(_attributes(vars(klass).get("__doc__") or ""))
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


def _attributes(docstring: str) -> dict[str, str]:
    """The entries of a Google-style ``Attributes:`` section, each joined onto one line."""
    lines = inspect.cleandoc(docstring).splitlines()
    if "Attributes:" not in lines:
        return {}
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    indent = None
    for line in lines[lines.index("Attributes:") + 1:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if depth == 0:
            break  # the next section, or prose after the list
        indent = depth if indent is None else indent
        match = _ENTRY.fullmatch(line.strip())
        if depth == indent and match:
            current = entries.setdefault(match.group(1), [])
            current.append(match.group(2))
        elif current is not None:
            current.append(line.strip())
    return {name: " ".join(parts) for name, parts in entries.items()}
