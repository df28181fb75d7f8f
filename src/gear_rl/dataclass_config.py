"""Configs written as nested dataclasses: the machinery behind ``gear-rl train``'s keys, shared by
the trainer's :class:`~gear_rl.train.config.TrainConfig`, the credit check and the studies.

- ``key=value`` overrides (:func:`parse_overrides`: values parsed as YAML scalars) and nested or
  dotted-key mappings (:func:`update_from_dict`: ``rollout.temperature=0.8`` sets a field of a
  section) applied to a config; a value keeps the field's type (:func:`coerce`), and an unknown
  key is an error that names the nearest valid one (:func:`settable_keys`).
- :func:`read_yaml`: a YAML file, with errors that name the file (and the line); a key given
  twice in one mapping is refused (and, with ``update_from_dict(unique_keys=True)``, one key
  set both dotted and inside its section), and so are aliases that expand past
  :data:`MAX_YAML_VALUES` values (an "alias bomb": a few hundred bytes that expand to
  gigabytes wherever the value is copied or printed).
- :func:`shown`: a user's value as an error message shows it, cut to :data:`SHOWN_CHARS`
  characters; every message built from a user's value formats it through this.
- :func:`field_docs` / :func:`field_default`: a field's description (its Google-style
  ``Attributes:`` entry, what ``--help`` prints) and its default.
- ``check_*``: a section's field checks, raising ``ValueError`` that names ``<prefix><field>``
  (:func:`check_int`: an integer within what torch and numpy take; :func:`check_memory`: a
  knob whose items would not fit in this machine's memory, :func:`machine_memory`);
  :func:`check_file`, :func:`check_folder`, :func:`check_output_folder` (the one check of
  every command's output folder): a path given by the user, with errors that say what is there
  instead (:func:`describe_path`: nothing, a directory, a FIFO, a read-only file system...).
- :func:`is_override`: whether a command-line argument is a ``key=value`` override or a path
  (``runs/a=b`` is a path).

Nothing here knows a particular config: this module imports nothing from ``gear_rl``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import inspect
import math
import os
import re
import reprlib
import stat
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

__all__ = [
    "INT64_MAX",
    "check_at_least",
    "check_file",
    "check_finite",
    "check_folder",
    "check_int",
    "check_memory",
    "check_one_of",
    "check_output_folder",
    "check_positive",
    "check_unit_interval",
    "coerce",
    "describe_path",
    "field_default",
    "field_docs",
    "flatten_keys",
    "hydra_override_key",
    "is_override",
    "load_yaml",
    "machine_memory",
    "nearest",
    "parse_overrides",
    "read_yaml",
    "settable_keys",
    "shown",
    "update_from_dict",
]

ConfigT = TypeVar("ConfigT")


def nearest(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate closest to ``word`` (``difflib``'s ratio at least ``cutoff``), or None."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=cutoff)
    return close[0] if close else None


SHOWN_CHARS = 200
"""The most characters of a user's value an error message shows (:func:`shown`)."""

_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 3, 8, 8, 8
_SHOWN.maxset = _SHOWN.maxfrozenset = _SHOWN.maxdeque = _SHOWN.maxarray = 8
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = SHOWN_CHARS


def shown(value: Any) -> str:
    """``repr(value)`` for an error message, cut to about :data:`SHOWN_CHARS` characters: the
    first items of a long list, the ends of a long string, three levels of nesting. The work is
    bounded too, so a value that is huge once expanded (a YAML alias bomb, a 10 MB string) is
    never formatted whole. Every message that shows a user's value formats it through this."""
    if isinstance(value, int) and value.bit_length() > 4 * SHOWN_CHARS:
        return f"an integer of {len(hex(value)) * 1.2:.0f} or so digits"
    text = _SHOWN.repr(value)
    if len(text) > SHOWN_CHARS + 20:
        text = f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"
    return text


# --- section checks ------------------------------------------------------------------------


def check_finite(prefix: str, section: Any) -> None:
    """Every float knob of ``section`` is finite, and every integer knob fits in a signed 64-bit
    integer: nan passes every ``>=`` rule and inf every ``>`` rule, and either would only
    surface as a broken run (``optim.lr=inf``); a larger integer (``seed`` with 23 digits)
    only as torch's or numpy's ``OverflowError``, which names no key."""
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        hint = hints[f.name]
        options = (hint, *typing.get_args(hint))
        if float in options and isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{prefix}{f.name} must be a finite number, got {value}")
        if int in options and isinstance(value, int) and not isinstance(value, bool):
            check_int(prefix + f.name, value, -INT64_MAX - 1)


# The largest integer torch, numpy and numba take (a signed 64-bit integer).
INT64_MAX = 2**63 - 1


def check_int(key: str, value: Any, minimum: int, *, optional: bool = False) -> None:
    """``value`` is an integer (not a bool) in ``[minimum, INT64_MAX]`` (or None where
    ``optional``); the error names ``key``."""
    if optional and value is None:
        return
    low = "-2**63" if minimum == -INT64_MAX - 1 else str(minimum)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer >= {low}{' or None' if optional else ''}, "
                         f"got {shown(value)}")
    if value < minimum:
        raise ValueError(f"{key} must be an integer >= {low}, got {shown(value)}")
    if value > INT64_MAX:
        raise ValueError(f"{key} must be an integer <= 2**63 - 1 (64 bits, what torch and numpy "
                         f"take), got {shown(value)}")


def machine_memory() -> int | None:
    """Bytes of memory this process may use: the machine's physical memory, or its control
    group's limit where that is lower (a container, a scheduler's job); None where neither can
    be read. ``GEAR_RL_MEMORY_BYTES`` sets it instead (a machine shared with other jobs)."""
    given = os.environ.get("GEAR_RL_MEMORY_BYTES", "").strip()
    if given.isdigit():
        return int(given)
    sizes = []
    with contextlib.suppress(ValueError, OSError, AttributeError):
        sizes.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            sizes.append(int(text))
    return min(sizes) if sizes else None


def check_memory(factors: Mapping[str, int], bytes_each: int, what: str) -> None:
    """Refuse knobs whose product (``factors``: ``{key: value}``) counts items ``what`` that,
    at ``bytes_each`` bytes each, would not fit in :func:`machine_memory`: a run that would be
    killed for memory part-way (no message, minutes in) is refused at config time, naming its
    keys. ``bytes_each`` is a floor, what one item costs at the least whatever the model, so
    only what cannot fit is refused; what fits may still need more."""
    memory = machine_memory()
    count = math.prod(factors.values())
    if memory is None or count * bytes_each <= memory:
        return
    keys = " x ".join(factors)
    values = " x ".join(f"{value:,}" for value in factors.values())
    product = f" = {values} = {count:,}" if len(factors) > 1 else f"={count:,}"
    lower = "lower it" if len(factors) == 1 else "lower one of them"
    raise ValueError(f"{keys}{product} {what} would need at least {count * bytes_each / 1e9:,.1f} "
                     f"GB of memory ({bytes_each:,} bytes each at the least), and this machine "
                     f"has {memory / 1e9:.1f} GB: {lower}")


def check_bool(key: str, value: Any) -> None:
    """``value`` is a bool: a string such as ``"ture"`` (or a 2) would otherwise switch a knob
    on by its truth value; the error names ``key``."""
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {shown(value)}")


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
        guess = nearest(value, allowed) if isinstance(value, str) else None
        hint = f"; did you mean {guess!r}?" if guess else ""
        raise ValueError(f"{key} must be one of {tuple(allowed)}, got {shown(value)}{hint}")


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
        raise ValueError(errors[0] if errors else f"{key}: bad value {shown(value)}")
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ValueError(f"{key} must be a bool, got {shown(value)}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"{key} must be an int, got {shown(value)}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{key} must be a number, got {shown(value)}")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"{key} must be a string, got {shown(value)}")
    if origin is list or hint is list:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key} must be a list of strings, got {shown(value)}")
        return list(value)
    if _is_mapping(hint):
        if not isinstance(value, Mapping):
            raise ValueError(f"{key} must be a mapping, got {shown(value)}")
        return dict(value)
    return value


class _Setter:
    """Sets dotted keys on the config ``root``; ``help_pointer`` ends the errors that list keys
    (where the user finds every key described); ``unique``: each key may be set once."""

    def __init__(self, root: Any, help_pointer: str, unique: bool = False) -> None:
        self.root = root
        self.pointer = f" ({help_pointer})" if help_pointer else ""
        self.unique = unique
        self.claimed: list[str] = []  # with unique: the full keys set so far, each once

    def claim(self, full_key: str, *, whole: bool = False) -> None:
        """With ``unique``, record that ``full_key`` is set; a key set twice in one mapping
        (once dotted, once inside its section: the last would count without a word), or a
        free-keyed field's key and then that whole field (``whole``), raises."""
        if not self.unique:
            return
        for other in self.claimed:
            if whole and other.startswith(full_key + "."):
                raise ValueError(f"config key {shown(full_key)} is set as a whole after "
                                 f"{shown(other)}, which it would drop without a word: set "
                                 "the keys of "
                                 f"{shown(full_key)} one way (dotted, or inside it), each once")
            if other == full_key or (not whole and (other.startswith(full_key + ".")
                                                    or full_key.startswith(other + "."))):
                raise ValueError(f"config key {shown(other)} is set twice (as a dotted key and "
                                 f"inside its section, or in two spellings of one key); only "
                                 f"the last would count: give it once")
        if not whole:
            self.claimed.append(full_key)

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
            self.claim(full_key)
            target = getattr(config, name)
            *parents, leaf = rest.split(".")
            for parent in parents:
                target = target.setdefault(parent, {})
            target[leaf] = value
            return
        if rest:
            raise ValueError(f"unknown config key {shown(full_key)}: {name!r} has no sub-keys"
                             f"{self.pointer}")
        if _is_mapping(hint):  # the whole free-keyed field: it replaces any key set before
            self.claim(full_key, whole=True)
            value = coerce(full_key, value, hint)
            for sub in value:
                self.claim(f"{full_key}.{sub}")
        else:
            self.claim(full_key)
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
            return ValueError(f"unknown config key {shown(full_key)}; did you mean {options}?")
        here = settable_keys(type(config), prefix, depth=1)
        where = f"{prefix[:-1]} keys" if prefix else "top-level keys"
        return ValueError(f"unknown config key {shown(full_key)}; valid {where}: {', '.join(here)}"
                          f"{self.pointer}")


def update_from_dict(config: ConfigT, data: Mapping[str, Any], *, help_pointer: str = "",
                     unique_keys: bool = False) -> ConfigT:
    """Set the keys of nested (or dotted-key) mapping ``data`` on dataclass ``config`` (in place)
    and return it. A value keeps its field's type (:func:`coerce`); a dict-valued field takes
    free sub-keys; an unknown key raises naming the nearest valid key of ``config``, and the
    errors that list keys end with ``help_pointer``. ``unique_keys`` (one config file): a key
    set twice, dotted and inside its section, or a dict-valued field set whole after one of its
    keys, raises instead of the last silently winning."""
    if not isinstance(data, Mapping):
        raise ValueError(f"config must be a mapping, got {type(data).__name__}")
    setter = _Setter(config, help_pointer, unique_keys)
    for key, value in data.items():
        setter.set(config, str(key), value, str(key))
    return config


def flatten_keys(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}, "c.d": 2}`` -> ``{"a.b": 1, "c.d": 2}`` (an empty mapping stays a
    value)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_keys(value, name + "."))
        else:
            out[name] = value
    return out


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a.b": 1, "c": "x"}``; values are parsed as YAML scalars
    (``1e-5`` -> float, ``true`` -> bool, ``null`` -> None, ``[1, 2]`` -> list). A key given
    again overrides the earlier one (layered overrides); a YAML mapping value holding one key
    twice (``credit={a: 1, a: 2}``) raises."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {shown(item)} is not of the form key=value")
        key = key.strip()
        try:
            value = yaml.load(raw, Loader=_StrictLoader) if raw.strip() else ""
        except (_DuplicateKeyError, _AliasBombError) as error:
            raise ValueError(f"override {shown(item)}: {error.problem}") from None
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str) and _looks_like_float(raw):
            value = float(raw)
        out[key] = value
    return out


def _looks_like_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class _DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that holds one key twice."""


MAX_YAML_VALUES = 100_000
"""The most values (scalars, lists, mappings) a YAML document may hold, counting each alias
(``*name``) as the values it repeats: nine nested aliases of nine items each are 334 bytes
that expand to 387 million values, which PyYAML builds as shared references but every copy
(``dataclasses.asdict``) or message expands in full. A config or a study holds a few hundred
values."""


def _expanded_values(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values ``node`` stands for with every alias written out (``sizes``: the nodes
    counted so far, by id; a node that holds itself counts as more than :data:`MAX_YAML_VALUES`
    values)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    sizes[id(node)] = MAX_YAML_VALUES + 1  # until counted: a node inside itself is unbounded
    total = 1
    if isinstance(node, yaml.SequenceNode):
        children: list[yaml.Node] = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    else:
        children = []
    for child in children:
        total += _expanded_values(child, sizes)
        if total > MAX_YAML_VALUES:
            break
    sizes[id(node)] = total
    return total


class _AliasBombError(yaml.constructor.ConstructorError):
    """A document whose aliases expand past :data:`MAX_YAML_VALUES` values."""


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a mapping holding a key twice is an error (YAML
    requires unique keys; PyYAML keeps the last value without a word), and so is a document
    whose aliases expand past :data:`MAX_YAML_VALUES` values. Keys a merge (``<<``) brings in
    may still be overridden, as YAML's merge allows."""

    def construct_document(self, node: yaml.Node) -> Any:
        sizes: dict[int, int] = {}
        if _expanded_values(node, sizes) > MAX_YAML_VALUES:
            raise _AliasBombError(
                None, None, f"it expands to more than {MAX_YAML_VALUES:,} values (aliases, "
                "*name, repeat their anchor's values wherever the document is copied or "
                "shown; or an anchor holds itself): a config holds a few hundred; write the "
                "values out, or repeat fewer", node.start_mark)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = lines.get(key)
            except TypeError:
                continue  # an unhashable key: the base class names it
            if first is not None:
                where = f"line {line}" if first == line else f"lines {first} and {line}"
                raise _DuplicateKeyError(
                    None, None, f"key {shown(key)} appears twice in one mapping ({where}); only "
                    "the last would count: keep one", key_node.start_mark)
            lines[key] = line
        return super().construct_mapping(node, deep=deep)


def _path_kind(mode: int) -> str:
    """What a ``stat`` mode is, in words (``a directory``, ``a named pipe (FIFO)``...)."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"),
             (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def describe_path(path: str | Path) -> str:
    """What is at ``path``, for an error message: ``does not exist``, ``is a directory``,
    ``is a named pipe (FIFO)``, ``is a regular file``... (links followed; a link to nothing
    says so), or why it cannot be looked at."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if os.path.islink(path):
            return (f"is a symbolic link to {os.readlink(path)!r}, which does not exist "
                    "(a dangling link)")
        return "does not exist"
    except NotADirectoryError:
        return "does not exist (a folder on its path is a file)"
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    return f"is {_path_kind(mode)}"


def check_file(path: str | Path, what: str) -> Path:
    """``path`` if it is a regular file; otherwise ``ValueError`` naming ``what``, the path and
    what is there instead (nothing, a directory, a FIFO...)."""
    return _check_kind(Path(path), what, Path.is_file, "a file")


def check_folder(path: str | Path, what: str) -> Path:
    """``path`` if it is a directory; otherwise ``ValueError`` naming ``what``, the path and
    what is there instead."""
    return _check_kind(Path(path), what, Path.is_dir, "a directory")


def _check_kind(path: Path, what: str, test: Callable[[Path], bool], kind: str) -> Path:
    if not test(path):
        found = describe_path(path)
        tail = "" if found.startswith(("does not", "cannot")) else f", not {kind}"
        raise ValueError(f"{what} {str(path)!r} {found}{tail}")
    return path


def check_output_folder(path: str | Path, what: str) -> Path:
    """``path`` if files can be written into it: a directory, or nothing yet (it is created)
    below a directory, on a file system this process may write. A file (or a FIFO, a dangling
    link...) there or on its way, a read-only file system or a folder this process may not
    write raises ``ValueError`` naming ``what`` and the path. The one check of every command
    that writes an output folder (``train out=``, ``export``, ``report --out``, ``compare
    --out``, ``credit-check out=``, ``study out=``), before it writes anything."""
    path = Path(path).expanduser()
    for place in (path, *path.parents):
        if place.is_dir():
            problem = _unwritable(place)
            if problem:
                where = "" if place == path else f" (it would be created in {str(place)!r})"
                raise ValueError(f"{what} {str(path)!r} cannot be written{where}: {problem}; "
                                 "give a folder on a writable file system")
            return path
        if os.path.lexists(place):
            found = describe_path(place)
            where = (f"{str(path)!r} {found}, not a folder" if place == path else
                     f"{str(path)!r} cannot be created: {str(place)!r} on its path {found}")
            raise ValueError(f"{what} {where}; give a folder (it is created if missing)")
    return path


def _unwritable(folder: Path) -> str | None:
    """Why this process cannot create files in the existing ``folder`` (a read-only file
    system, no permission, an immutable folder), or None."""
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "it is on a read-only file system"
    except OSError as error:
        return f"it cannot be looked at ({error.strerror})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "this process may not write there (permissions, or an immutable folder)"
    return None


def is_override(arg: str) -> bool:
    """Whether a command-line argument is a ``key=value`` override: a dotted key (``step``,
    ``rollout.temperature``, ``variant.a.credit.lam``) before its first ``=``. Anything else
    is a path, even one holding ``=`` (``runs/lr=3e-5``)."""
    key, sep, _ = arg.partition("=")
    return bool(sep) and _OVERRIDE_KEY.fullmatch(key.strip()) is not None


_OVERRIDE_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[\w-]+)*")


def hydra_override_key(override: str) -> str:
    """The dotted key of a Hydra override or of a key written as one: ``+a.b=1``, ``++a.b=1``,
    ``~a.b`` and ``a.b`` all give ``a.b``."""
    return override.lstrip("+~").split("=", 1)[0].strip()


def load_yaml(text: str, name: str) -> Any:
    """The YAML document ``text`` (None when empty), read by the strict loader: a key given
    twice in one mapping, or aliases that expand past :data:`MAX_YAML_VALUES` values, raise
    ``ValueError`` naming ``name`` (``config file 'x.yaml'``), as does invalid YAML (with its
    line)."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except _AliasBombError as error:
        raise ValueError(f"{name} is refused: {error.problem}") from None
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ValueError(f"{name} is not valid YAML{line}: "
                         f"{getattr(error, 'problem', None) or error}") from None


def read_yaml(path: str | Path, what: str = "config file") -> Any:
    """The YAML document at ``path`` (None for an empty file); a missing file (or a directory,
    a FIFO...), invalid YAML (with its line; a key given twice in one mapping is invalid; so
    are aliases that expand too far, :func:`load_yaml`) or a file that is not UTF-8 raises
    ``ValueError`` naming ``what`` and the path."""
    path = check_file(path, what)
    try:
        return load_yaml(path.read_text(encoding="utf-8"), f"{what} {str(path)!r}")
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
