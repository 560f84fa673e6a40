"""The CLI's ``--config FILE``: the :class:`~tiered_memory.config.MemoryConfig` an application
uses, read from a file, so that ``search``, ``context``, ``working`` and ``consolidate`` (every
command that opens the memory) see what the application sees; and ``tiered-memory config``, which
writes a config out as such a file (``--defaults``: the defaults).

The file names MemoryConfig's fields: a table per section (``[retrieval]``, ``[budget]``,
``[working]``, ``[consolidation]``, ...) holding that section's fields by name, and MemoryConfig's
own fields (``dedup_threshold``, ``write_chunk``, ...) at the top. What it leaves out keeps its
default. A file whose name ends in ``.json`` is read as JSON (a JSON object of the same shape;
``null`` sets a field that takes ``None``); any other as TOML, with :mod:`tomllib` (Python 3.11
and later; on 3.10, write the file as JSON: the library does not depend on ``tomli``).

An unknown section or key, a value of the wrong type, or one :func:`~.config.config_problems`
refuses is a :class:`~tiered_memory.errors.ConfigurationError` naming the file and every bad key,
raised before the memory is opened.
"""

from __future__ import annotations

import difflib
import json
import math
import sys
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from .config import MemoryConfig, config_problems
from .errors import ConfigurationError
from .recall.search import turn_weights


def _kind(f: Any) -> str:
    """A field's type as written, without ``| None`` ("int", "dict[str, float]", "BudgetConfig")."""
    return str(f.type).split(" |")[0]


_BAD = object()  # a value _value refused (config_problems then leaves that field alone)


def _value(value: object, f: Any, shown: str, problems: list[str]) -> object:
    """``value`` as field ``f`` holds it (an int where a float is meant becomes that float), or
    :data:`_BAD`: a type config_problems does not check (a string, a table) is checked here."""
    kind = _kind(f)
    if value is None:
        return value  # config_problems says whether the field takes None
    if kind == "str" and not isinstance(value, str):
        problems.append(f"{shown} must be a string, got {value!r}")
        return _BAD
    if kind.startswith("dict") and not isinstance(value, dict):
        problems.append(f"{shown} must be a table (name = number, ...), got {value!r}")
        return _BAD
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _unknown(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key.rpartition(".")[2], known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key {key!r} ({hint}'tiered-memory config --defaults' lists them all)"


def config_from_mapping(data: Mapping[str, object], where: str) -> MemoryConfig:
    """The defaults with what ``data`` (a decoded config file, named ``where`` in errors) sets
    (pure).

    Raises:
        ConfigurationError: naming ``where`` and every unknown section or key and every bad value.
    """
    base = MemoryConfig()
    problems: list[str] = []
    top: dict[str, object] = {}
    known = {f.name: f for f in fields(MemoryConfig)}
    for name, given in data.items():
        f = known.get(name)
        if f is None:
            problems.append(_unknown(name, list(known)))
            continue
        section = getattr(base, name)
        if not is_dataclass(section):
            top[name] = _value(given, f, name, problems)
            continue
        if not isinstance(given, dict):
            problems.append(f"{name} must be a table of {type(section).__name__}'s fields "
                            f"([{name}] in TOML), got {given!r}")
            continue
        inner = {g.name: g for g in fields(section)}
        changes: dict[str, object] = {}
        for key, value in given.items():
            if key in inner:
                changes[key] = _value(value, inner[key], f"{name}.{key}", problems)
            else:
                problems.append(_unknown(f"{name}.{key}", list(inner)))
        top[name] = replace(section, **{k: v for k, v in changes.items() if v is not _BAD})  # type: ignore[type-var]
    config = replace(base, **{k: v for k, v in top.items() if v is not _BAD})  # type: ignore[arg-type]
    problems += config_problems(config)  # every bad value too, beside the unknown keys
    if not problems:
        try:  # what recall checks as it reads it (turn_fusion, fusion_weights, spread): now, with the file named
            turn_weights(config.retrieval)
        except ConfigurationError as e:
            problems.append(str(e))
    if problems:
        raise ConfigurationError(f"config file {where}: " + "; ".join(problems))
    return config


def _sections() -> list[str]:
    base = MemoryConfig()
    return [f.name for f in fields(base) if is_dataclass(getattr(base, f.name))]


def load_config(path: str | Path) -> MemoryConfig:
    """The MemoryConfig the file at ``path`` describes (TOML, or JSON for a ``.json`` file).

    Raises:
        ConfigurationError: the file cannot be read or parsed, or :func:`config_from_mapping`
            refuses what it holds.
    """
    where = Path(path)
    try:
        raw = where.read_bytes()
    except OSError as e:
        raise ConfigurationError(f"cannot read config file {where}: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigurationError(f"config file {where} is not UTF-8 ({e.reason} at byte {e.start})") from e
    if where.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ConfigurationError(f"config file {where} is not valid JSON: {str(e)[:200]}") from e
    else:
        if sys.version_info < (3, 11):
            raise ConfigurationError(f"config file {where}: reading TOML needs Python 3.11 or later (tomllib); "
                                     "write the same settings as a .json file")
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigurationError(f"config file {where} is not valid TOML ({e}); a .json file is "
                                     "read as JSON") from e
    if not isinstance(data, dict):
        raise ConfigurationError(f"config file {where} must hold an object of MemoryConfig's sections and "
                                 f"keys, got {type(data).__name__}")
    return config_from_mapping(data, str(where))


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else "nan"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value), ensure_ascii=False)  # a TOML basic string is a JSON string


def _toml_lines(config: object) -> list[str]:
    lines = []
    for f in fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if is_dataclass(value):
            continue
        # TOML has no null: a field left at None is shown, commented out, with what it takes
        lines.append(f"# {f.name} = ...  (None: not set; takes {_kind(f)})" if value is None
                     else f"{f.name} = {_toml_value(value)}")
    return lines


def config_toml(config: MemoryConfig) -> str:
    """``config`` as a TOML file :func:`load_config` reads back as an equal config (pure)."""
    out = _toml_lines(config)
    for name in _sections():
        out += ["", f"[{name}]", *_toml_lines(getattr(config, name))]
    return "\n".join(out) + "\n"
