"""Typed documents: the TOML and JSON files bakery reads are decoded here into msgspec Structs.

Each loader declares its file's shape once as ``Document`` subclasses (unknown fields are
refused, types are strict: ``true`` is no integer and ``"3"`` no number). ``decode`` turns
a parsed document into those types, or raises the loader's own ``BakeryError`` subclass
with one line naming the file and every bad field path (``$.bases.default.sha256:
expected str, got int``). Ranges and formats live in the types too
(``Annotated[int, Meta(ge=0, le=3)]``); what types cannot say (cross-field rules, safe
paths) stays with the loader, after decoding. A document type is also the value the rest
of bakery sees: one frozen type per document, no copy (tests/test_house.py's TWO_TYPES
names the values built from more than their document, with why).

Outputs: ``encode_json`` is the one JSON encoder (``write_json_atomic`` writes through
it); a typed output is written from its type, with the bytes the dicts before it gave.

Which JSON outputs are typed (and by which type), and why the few others are dicts, is
listed in one place, tests/test_house.py (``TYPED_WRITERS``, ``UNTYPED_WRITERS``,
``OTHER_JSON``), which fails on a writer it does not list. A document read back is decoded
by the type that wrote it; a narrow view (``bake.manifest.ServedBake``: series and base
only) reads a manifest of another bakery version. Read as dicts, not decoded: a model's
config.json (Hugging Face's format, read leniently by ``launch.model_config``), a tiny
model's note and a bundle's bundle.json (bundles of other tools carry their own).
"""

from __future__ import annotations

import dataclasses
import json
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

from bakery.errors import BakeryError
from bakery.tree import MAX_READ, read_bounded, write_atomic

__all__ = [
    "Document",
    "Sha256",
    "Text",
    "NonEmptyText",
    "OneLine",
    "SHA256_PATTERN",
    "decode",
    "try_decode",
    "try_decode_json",
    "refuse",
    "problems",
    "read_text",
    "parse_toml",
    "too_deep",
    "read_toml",
    "read_json",
    "load_toml",
    "encode_json",
    "write_json_atomic",
]

T = TypeVar("T")
MAX_LISTED = 12  # problems spelt out in one refusal; the rest are counted
_UNREADABLE = "check that the path names a readable file"
_NOT_UTF8 = "save the file as UTF-8 text"
_SYNTAX = "fix the syntax at the place named (or restore the file from git)"


class Document(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Base of every file schema: a misspelt field is an error, never a silent default.

    Frozen, as the value the rest of bakery sees (mypy's dataclass rules make every
    subclass repeat ``frozen=True``)."""


SHA256_PATTERN = r"^[0-9a-f]{64}\Z"  # as pins and BAKED.json spell a sha256
Sha256 = Annotated[str, Meta(pattern=SHA256_PATTERN, description="64 lowercase hex digits")]
# Strings that go into paths, argv, environments or one-line messages.
Text = Annotated[str, Meta(pattern=r"^[^\0]*\Z", description="text without NUL")]
NonEmptyText = Annotated[str, Meta(pattern=r"^[^\0]+\Z", description="non-empty text without NUL")]
OneLine = Annotated[str, Meta(pattern=r"^[^\n\0]*\Z", description="one line")]


MAX_DEPTH = 32  # no document of ours nests past 6; the schema walk recurses per level
MAX_KEY_PARTS = 64
# A dotted TOML key of more than MAX_KEY_PARTS parts: tomllib takes quadratic time on one.
_PART = r"""(?:[\w-]+|"[^"\n]*"|'[^'\n]*')"""
_LONG_KEY = re.compile(_PART + r"(?:[ \t]*\.[ \t]*" + _PART + ")" + f"{{{MAX_KEY_PARTS}}}")


def read_text(path: Path, error: type[BakeryError], what: str = "", limit: int = MAX_READ) -> str:
    """A document's text: a regular file (a FIFO never hangs, /dev/zero never fills
    memory), at most ``limit`` bytes, UTF-8; anything else is one ``error``."""
    name = f"{what} {path}".strip()
    try:
        return read_bounded(Path(path), limit).decode("utf-8")
    except OSError as exc:
        raise error(f"cannot read {name} ({exc.strerror})", hint=_UNREADABLE) from None
    except UnicodeDecodeError as exc:
        raise error(f"cannot read {name} (not UTF-8, byte {exc.start})", hint=_NOT_UTF8) from None


def too_deep(data: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``data`` nests lists/tables deeper than ``limit`` (walked without recursion)."""
    pending = [(data, 0)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list):
            if depth >= limit:
                return True
            items = value.values() if isinstance(value, dict) else value
            pending.extend((v, depth + 1) for v in items)
    return False


def parse_toml(text: str, where: str, error: type[BakeryError]) -> dict[str, Any]:
    """TOML text as a dict, bounded in time and depth; bad TOML is one ``error``."""
    try:
        if _LONG_KEY.search(text):
            raise ValueError(f"a dotted key of more than {MAX_KEY_PARTS} parts")
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: not valid TOML ({exc})", hint=_SYNTAX) from None
    except (ValueError, RecursionError) as exc:
        reason = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        raise error(f"{where}: not valid TOML here ({reason})", hint=_SYNTAX) from None
    if too_deep(data):
        raise error(f"{where}: nested deeper than {MAX_DEPTH} levels", hint=_SYNTAX)
    return data


def read_toml(path: Path, error: type[BakeryError]) -> dict[str, Any]:
    """A TOML file as a dict; unreadable, not UTF-8 or not TOML is one ``error``."""
    try:
        text = read_bounded(Path(path)).decode("utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror})", hint=_UNREADABLE) from None
    except UnicodeDecodeError as exc:
        raise error(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})", hint=_NOT_UTF8
        ) from None
    return parse_toml(text, str(path), error)


def read_json(path: Path, what: str, error: type[BakeryError], limit: int = MAX_READ) -> Any:
    """A JSON file's value; unreadable, not UTF-8 or not JSON is one ``error`` naming ``what``.

    The stdlib parser, not msgspec's: it names the line, and it reads NaN so that the
    loaders can refuse it with a message of their own. A key given twice is refused: the
    last one would win unseen (a reviewer reads 0.01, 1e9 applies)."""
    text = read_text(path, error, what, limit)
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}: {exc.msg}"
        raise error(f"cannot read {what} {path} (invalid JSON, {where})", hint=_SYNTAX) from None
    except _DuplicateKey as exc:
        raise error(f"cannot read {what} {path} (key {exc} given twice)", hint=_SYNTAX) from None
    except RecursionError:  # [[[[...]]]] nested past the interpreter's stack
        raise error(f"cannot read {what} {path} (JSON nested too deeply)", hint=_SYNTAX) from None
    if too_deep(data):
        raise error(f"cannot read {what} {path} (nested deeper than {MAX_DEPTH})", hint=_SYNTAX)
    return data


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(repr(key)[:80])
        out[key] = value
    return out


def decode(data: Any, kind: type[T], *, where: str, error: type[BakeryError], hint: str) -> T:
    """``data`` (parsed from ``where``) as a ``kind``, or one ``error`` naming every bad field."""
    value, found = try_decode(data, kind)
    refuse(found, where=where, error=error, hint=hint)
    assert value is not None  # try_decode gives a value or problems
    return value


def refuse(found: list[str], *, where: str, error: type[BakeryError], hint: str) -> None:
    """Raise one ``error`` listing every problem (``path: what``) in ``where``, if any.

    The loaders' own rule checks use it too, so every refusal of a file reads alike."""
    if found:
        shown = "; ".join(found[:MAX_LISTED])
        if len(found) > MAX_LISTED:  # a hostile file must not make a megabyte-long line
            shown += f"; and {len(found) - MAX_LISTED} more"
        summary = shown if len(found) == 1 else f"{len(found)} problems: {shown}"
        raise error(f"{where}: {summary}", hint=hint)


def try_decode(data: Any, kind: type[T]) -> tuple[T | None, list[str]]:
    """``(value, [])``, or ``(None, problems)`` for a caller that gathers several documents'
    problems into one error (a JSONL file's lines)."""
    try:
        return msgspec.convert(data, kind, strict=True), []
    except msgspec.ValidationError as exc:
        # The walker misses nothing msgspec checks today; the fallback keeps a schema
        # feature it does not know from losing msgspec's own message.
        return None, problems(data, kind) or [_reword(str(exc))]


def try_decode_json(raw: bytes, kind: type[T]) -> tuple[T | None, str]:
    """JSON bytes as ``kind``, or ``(None, why)`` in one short line: for readers that take
    a damaged document as none (an old run folder's record, another version's manifest)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return None, f"not JSON ({type(exc).__name__})"
    value, found = try_decode(data, kind)
    return value, "; ".join(found)[:200]


def load_toml(path: Path, kind: type[T], *, error: type[BakeryError], hint: str) -> T:
    """Read and decode one TOML file (see ``read_toml`` and ``decode``)."""
    return decode(read_toml(path, error), kind, where=str(path), error=error, hint=hint)


# --- every problem at once -------------------------------------------------------------
# msgspec stops at the first bad field. On failure this walks the schema beside the data
# so the message lists every unknown, missing and mistyped field, each with its concrete
# path (msgspec spells a map's key as [...]); each leaf is still judged by msgspec.


def problems(data: Any, kind: Any, at: str = "$") -> list[str]:
    """Every place ``data`` departs from ``kind``, as ``path: what`` lines (empty if none)."""
    kind = _without_none(kind) if data is not None else kind
    origin = typing.get_origin(kind)
    if origin is Annotated:  # the inner type's problems first; the constraint once it holds
        inner, *metas = typing.get_args(kind)
        found = problems(data, inner, at)
        if found:
            return found
        found = _leaf(data, kind, at)
        # A Meta's description says the constraint in words ("0..3", "a file name").
        words = [m.description for m in metas if isinstance(m, Meta) and m.description]
        return [f"{at}: must be {words[0]}, not {_shown(data)}"] if found and words else found
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        if not isinstance(data, dict):
            return _leaf(data, kind, at)
        fields = {f.encode_name: f for f in msgspec.structs.fields(kind)}
        found = []
        if kind.__struct_config__.forbid_unknown_fields:  # a server's answer may grow fields
            known = ", ".join(fields)
            found += [
                f"{_child(at, k)}: unknown field (known: {known})" for k in data if k not in fields
            ]
        found += [
            f"{at}.{name}: missing" for name, f in fields.items() if f.required and name not in data
        ]
        for name, field in fields.items():
            if name in data:
                found += problems(data[name], field.type, f"{at}.{name}")
        return found
    if origin is dict and isinstance(data, dict):
        key_kind, value_kind = typing.get_args(kind)
        found = [p for key in data for p in problems(key, key_kind, f"{at} key {key!r}")]
        for key, value in data.items():
            found += problems(value, value_kind, _child(at, key))
        return found
    if origin in (list, tuple) and isinstance(data, list):
        args = typing.get_args(kind)
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            return [p for i, v in enumerate(data) for p in problems(v, args[0], f"{at}[{i}]")]
    return _leaf(data, kind, at)


_PLAIN_KEY = re.compile(r"[A-Za-z0-9_./-]+")


def _child(at: str, key: object) -> str:
    """``at.key`` for a plain key; ``at['odd key']`` (quoted, escaped) for any other, so
    a key holding a newline or a quote cannot break the one error line or fake a path."""
    if isinstance(key, str) and _PLAIN_KEY.fullmatch(key):
        return f"{at}.{key}"
    return f"{at}[{key!r}]"


def _without_none(kind: Any) -> Any:
    """``X | None`` (or ``X | UnsetType``, a field left out) as ``X``: the data is there and
    not None, so the walk can go into ``X``."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        absent = (type(None), msgspec.UnsetType)
        rest = [arg for arg in typing.get_args(kind) if arg not in absent]
        if len(rest) == 1:
            return rest[0]
    return kind


def _leaf(data: Any, kind: Any, at: str) -> list[str]:
    try:
        msgspec.convert(data, kind, strict=True)
    except msgspec.ValidationError as exc:
        if typing.get_origin(kind) is typing.Literal:
            allowed = ", ".join(map(repr, typing.get_args(kind)))
            return [f"{at}: must be one of {allowed}, not {_shown(data)}"]
        message = _reword(str(exc))
        if message.startswith("expected ") and ", got " not in message:
            # A constraint (<= 3, a regex, a length) without words: say the value too.
            message += f", not {_shown(data)}"
        return [f"{at}: {message}"]
    return []


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a hostile value makes no huge line)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_AT = re.compile(r" - at `\$(?P<rest>[^`]*)`$")


def _reword(message: str) -> str:
    """msgspec's ``Expected `int`, got `str` - at `$[0]``` as ``expected int, got str at [0]``."""
    match = _AT.search(message)
    if match:
        message = message[: match.start()] + (f" at {match['rest']}" if match["rest"] else "")
    message = message.replace("`object`", "a table/object").replace("`array`", "an array")
    message = message.replace("`", "")
    return message[:1].lower() + message[1:]


# --- the one encoder ---------------------------------------------------------------------


def encode_json(
    value: Any,
    *,
    sort_keys: bool = False,
    ascii_only: bool = True,
    strict: bool = False,
    default: Any = None,
    one_line: bool = False,
) -> bytes:
    """``value`` as the JSON bytes bakery writes: indent 2 and a final newline, or with
    ``one_line`` a single line without one (a stamp only machines read).

    ``value`` is a frozen Struct, or a dict/list (a free-form part) that may hold Structs:
    ``json.dumps`` writes it, meeting each Struct as a dict in field order (an UNSET field
    left out), so the bytes are the ones the writers made from dicts (key order, float
    spelling, escapes).
    ``sort_keys`` for reproducible outputs; ``ascii_only`` escapes all but ASCII (text from
    the environment or argv may hold surrogates UTF-8 cannot encode); ``strict`` refuses
    NaN and infinities, which are not JSON; ``default`` as in ``json.dumps``."""

    def plain(obj: Any) -> Any:
        if isinstance(obj, msgspec.Struct):  # an UNSET field is left out, as msgspec does
            return {k: v for k, v in msgspec.structs.asdict(obj).items() if v is not msgspec.UNSET}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # a value in a record
            return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        if default is not None:
            return default(obj)
        raise TypeError(f"{type(obj).__name__} is not JSON serializable")

    text = json.dumps(
        value,
        indent=None if one_line else 2,
        sort_keys=sort_keys,
        ensure_ascii=ascii_only,
        allow_nan=not strict,
        default=plain,
    )
    return (text if one_line else text + "\n").encode("utf-8")


def write_json_atomic(
    path: Path,
    data: Any,
    *,
    sort_keys: bool = False,
    strict: bool = False,
    default: Any = None,
    ascii_only: bool = False,
) -> None:
    """``data`` through ``encode_json`` (UTF-8 unless ``ascii_only``) and ``write_atomic``:
    ``path`` is either old or complete.

    Reports sort keys so two runs diff cleanly; server responses must not, because
    ``top_logprobs`` order is meaningful (the top-1 margin is first minus second)."""
    write_atomic(
        path,
        encode_json(
            data, sort_keys=sort_keys, ascii_only=ascii_only, strict=strict, default=default
        ),
    )
