"""The series as a git repository, and back (Electron keeps its patches as a branch).

``export`` writes the pristine package's text sources (``*.py``, ``*.pyi`` and every file
the series touches) under ``<package>/`` as the first commit (tag ``bakery-pristine``),
then one commit per patch, or per DCP stage, on branch ``series``: the message is the
patch's summary and description, its author the header's, and trailers name the patch
(``Bakery-Patch:``), its stage and upstream status. Dates are fixed, so two exports of
one series are the same commits. Maintainers then use git's own tools (log, blame,
``rebase -i``, ``format-patch`` for upstream, which applies with ``-p1`` to vLLM).

``import_git`` is the way back: the files HEAD changes against ``bakery-pristine``
become the series' per-file patches (refresh's rules: a patched file keeps its patch's
name, a new one gets the next number), and each commit with a ``Bakery-Patch:`` trailer
gives that patch its summary, description and author back (after a reword).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

import tomlkit

from bakery import git
from bakery.bake.pristine import unpacked
from bakery.errors import BakeryError, SeriesError, UsageError
from bakery.maintain import refresh
from bakery.schema import decode
from bakery.series import apply
from bakery.series.diff import parse_patch
from bakery.series.series import PatchEntry, Series
from bakery.tree import inside, remove_tree, write_atomic

__all__ = ["export", "import_git", "PRISTINE_TAG", "BRANCH"]

PRISTINE_TAG = "bakery-pristine"
BRANCH = "series"
_DATE = "1980-01-01T00:00:00+0000"  # fixed: the same series gives the same commits
_BOT = ("bakery", "bakery@localhost")
_AUTHOR = re.compile(r"^(?P<name>[^<>]+?)\s*<(?P<email>[^<>\s]+)>$")
_TRAILER = re.compile(r"^Bakery-(?P<key>Patch|Base): (?P<value>\S.*)$", re.M)
_ANY_TRAILER = re.compile(r"^Bakery-(?:Patch|Base|Stage|Upstream): .*$", re.M)


def _git(repo: Path, *args: str, env: dict | None = None, data: bytes | None = None) -> bytes:
    try:
        proc = git.run(args, repo=repo, env=env, data=data)
    except FileNotFoundError:
        raise BakeryError("git is not installed", hint="install git to export") from None
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()
        raise BakeryError(f"git {args[0]} failed in {repo}: {why[-1] if why else '?'}")
    return proc.stdout


def _commit(repo: Path, message: str, author: tuple[str, str]) -> None:
    env = {
        "GIT_AUTHOR_NAME": author[0],
        "GIT_AUTHOR_EMAIL": author[1],
        "GIT_COMMITTER_NAME": _BOT[0],
        "GIT_COMMITTER_EMAIL": _BOT[1],
        "GIT_AUTHOR_DATE": _DATE,
        "GIT_COMMITTER_DATE": _DATE,
    }
    _git(repo, "add", "-A", "--force")  # an ignore file in the tree never drops a patched file
    _git(
        repo,
        "commit",
        "-q",
        "--allow-empty",
        "--no-verify",
        "--cleanup=verbatim",  # the header as series.toml holds it, byte for byte
        "-F",
        "-",
        env=env,
        data=message.encode(),
    )


def _author(text: str) -> tuple[str, str]:
    match = _AUTHOR.match(text.strip())
    return (match["name"], match["email"]) if match else _BOT


def _message(entries, pin) -> str:
    if len(entries) == 1:
        e = entries[0]
        # Verbatim (import reads it back the same way): indentation, blank lines,
        # trailing spaces and a line that looks like a trailer all stay.
        body = [e.summary, "", e.description] if e.description else [e.summary]
    else:
        body = [f"stage {entries[0].stage}: " + "; ".join(e.file for e in entries), ""]
        body += [f"{e.file}: {e.summary}" for e in entries]
    trailers = [f"Bakery-Patch: {e.file}" for e in entries]
    trailers += [f"Bakery-Stage: {entries[0].stage}"] if len(entries) == 1 else []
    trailers += [f"Bakery-Upstream: {e.upstream}" for e in entries if e.upstream]
    trailers.append(f"Bakery-Base: {pin.requirement} {pin.sha256}")
    return "\n".join([*body, "", *trailers]) + "\n"


def export(series: Series, base_key: str, out: Path, by_stage: bool = False) -> list[str]:
    """Write the git repository; returns one line per commit. It is built in a staging
    folder beside ``out`` and renamed into place at the end: a failure leaves nothing."""
    if out.is_symlink():
        raise UsageError(
            f"--git names a symlink (bakery never writes through one): {str(out)!r}",
            hint="name a new folder",
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(
            f"--git folder exists and is not empty: {str(out)!r}", hint="name a new folder"
        )
    pin = series.base(base_key)
    package = unpacked(pin) / series.package
    plan = apply.plan(package, series.patches, max_fuzz=series.max_fuzz)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.new-{os.getpid()}"
    remove_tree(staging)  # this process's own name: a leftover of a reused pid
    staging.mkdir()
    try:
        shown = _write_repo(series, pin, package, plan, staging, by_stage, out)
        if out.is_dir() and not out.is_symlink():
            out.rmdir()  # the empty folder given (anything in it now: refused)
        os.rename(staging, out)
    except BaseException:
        remove_tree(staging)
        raise
    return shown


def _write_repo(series, pin, package, plan, repo: Path, by_stage: bool, out: Path) -> list[str]:
    _git(repo, "init", "-q", "-b", BRANCH)
    wanted = set(series.touched)
    for dirpath, _, names in os.walk(package):
        for name in names:
            rel = (Path(dirpath) / name).relative_to(package).as_posix()
            if name.endswith((".py", ".pyi")) or rel in wanted:
                write_atomic(repo / series.package / rel, (package / rel).read_bytes())
    _commit(
        repo, f"{pin.requirement} (pristine)\n\nBakery-Base: {pin.requirement} {pin.sha256}\n", _BOT
    )
    _git(repo, "tag", PRISTINE_TAG)
    groups: dict[int | str, list] = defaultdict(list)
    for entry in series.entries:
        groups[entry.stage if by_stage else entry.file].append(entry)
    owners = {p.name: p.paths for p in series.patches}
    shown = []
    for key in sorted(groups, key=str) if by_stage else list(groups):
        entries = groups[key]
        for entry in entries:
            for rel in owners[entry.file]:
                target = repo / series.package / rel
                after = plan.after[rel]
                if after is None:
                    target.unlink(missing_ok=True)
                else:
                    write_atomic(target, after, plan.modes.get(rel))
        author = _author(entries[0].author) if len(entries) == 1 else _BOT
        _commit(repo, _message(entries, pin), author)
        touched = {rel: plan.after[rel] for entry in entries for rel in owners[entry.file]}
        _check_commit(repo, series.package, touched, entries, out)
        shown.append(_message(entries, pin).splitlines()[0])
    return shown


def _check_commit(repo: Path, package: str, touched: dict, entries: list, out: Path) -> None:
    """HEAD must hold each touched file as the series makes it (None: deleted), byte for
    byte: an export that silently commits less would come back as a deleted patch."""
    for rel, after in sorted(touched.items()):
        name = f"{package}/{rel}"
        present = _git(repo, "ls-tree", "--name-only", "HEAD", "--", name).strip()
        held = _git(repo, "show", f"HEAD:{name}") if present else None
        if held != after:
            patches = ", ".join(e.file for e in entries)
            why = "it is missing" if held is None else "its bytes differ"
            raise BakeryError(
                f"the commit of {patches} does not hold its change to {name} as the series "
                f"makes it ({why}): {str(out)!r}",
                hint="check the git setup around the folder (a hook, an attributes file), "
                "then export again",
            )


def _trailers(message: str, token: str) -> list[str]:
    """The values of the message's ``token:`` trailers (``Base``, ``Patch``), in order."""
    return [m["value"].strip() for m in _TRAILER.finditer(message) if m["key"] == token]


# Git tree modes a unified diff of the series cannot carry (import would write the link's
# target or the submodule's commit as a file's text).
_NOT_A_FILE = {b"120000": "symlink", b"160000": "submodule (gitlink)"}


def import_git(series: Series, base_key: str, repo: Path, yes: bool = False) -> list[str]:
    """Write the series from the repository's HEAD; returns one line per change."""
    if not (repo / ".git").exists():
        raise UsageError(f"not a git repository: {str(repo)!r}", hint="`bakery export --git DIR`")
    pin = series.base(base_key)
    first = _git(repo, "log", "-1", "--format=%B", PRISTINE_TAG).decode()
    if f"{pin.requirement} {pin.sha256}" not in _trailers(first, "Base"):
        raise UsageError(
            f"{repo}'s {PRISTINE_TAG} is not the {base_key} base {pin.requirement}",
            hint="export again with `bakery export --git DIR --base KEY` for the base you import",
        )
    if _git(repo, "status", "--porcelain").strip():
        raise UsageError(f"{repo} has uncommitted changes", hint="commit or stash them first")
    prefix = series.package + "/"
    listing = _git(repo, "diff", "--name-only", "-z", "--no-renames", PRISTINE_TAG, "HEAD")
    package = unpacked(pin) / series.package
    differing: dict[str, tuple[bytes | None, bytes | None]] = {}
    modes: dict[str, tuple[bytes | None, bytes]] = {}  # rel -> (the tag's git mode, HEAD's)
    for raw in filter(None, listing.split(b"\0")):
        try:
            name = raw.decode()
        except UnicodeDecodeError:  # no patch file or series.toml can name it
            raise UsageError(
                f"HEAD changes a file whose name is not UTF-8: {raw!r}",
                hint="rename it in the repository (`git mv`), commit, then import again",
            ) from None
        if not name.startswith(prefix):
            raise UsageError(
                f"HEAD changes a file outside {prefix}: {name!r}",
                hint=f"the series patches only {prefix}: drop that change, then import again",
            )
        rel = name[len(prefix) :]
        before = inside(package, rel).read_bytes() if inside(package, rel).is_file() else None
        listed = _git(repo, "ls-tree", "HEAD", "--", name).split()  # mode type sha name
        if listed and listed[0] in _NOT_A_FILE:
            raise UsageError(
                f"HEAD makes {name!r} a {_NOT_A_FILE[listed[0]]}, which no patch of the "
                "series can carry",
                hint="commit it as a regular file, or drop that change, then import again",
            )
        after = _git(repo, "show", f"HEAD:{name}") if listed else None
        differing[rel] = (before, after)
        if listed:
            tagged = _git(repo, "ls-tree", PRISTINE_TAG, "--", name).split()
            modes[rel] = (tagged[0] if tagged else None, listed[0])
    changes = refresh.plan_refresh(series, differing)
    removed = [c.file for c in changes if c.action == "remove"]
    if removed and not yes:
        raise UsageError(
            f"would remove {len(removed)} patch(es) (pass --yes): " + ", ".join(removed)
        )
    headers = _headers_back(series, repo)  # checked by the schema before anything is written
    _prove_places(series, changes, package, differing, repo, modes)
    refresh.write_refresh(series, changes, remembered=refresh.remembered_entries(series))
    return [f"{c.action}: {c.file}" for c in changes] + _write_headers(series, headers)


def _prove_places(
    series: Series, changes: list, package: Path, differing: dict, repo: Path, modes: dict
):
    """The series the import would write, placed on the base in memory: every patch must
    place and give HEAD's files, or nothing is written (a folder of the base made a file,
    a file made a folder, would leave a series no bake takes)."""
    data = {e.file: series.patch_bytes(e) for e in series.entries}
    for change in changes:
        data.pop(change.file, None)
        if change.data is not None:
            data[change.file] = change.data
    order = sorted(data, key=lambda f: (int(f.partition("-")[0]), f))
    try:
        patches = [
            parse_patch(data[f], f, renames=series.renames, strip=series.strip) for f in order
        ]
        result = apply.plan(package, patches, max_fuzz=series.max_fuzz)
        wrong = sorted(
            rel
            for rel, (before, after) in differing.items()
            if result.after.get(rel, before) != after
        )
    except BakeryError as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BakeryError(
            f"the series HEAD of {str(repo)!r} makes does not place on the base ({why}); "
            "nothing written",
            hint="a file of the base made a folder, or a folder made a file, no patch can "
            "carry: undo that change in the repository, commit, then import again",
        ) from None
    # A mode change (`chmod +x`, committed) is no change of bytes: refresh writes no mode
    # lines, so it would be dropped without a word. HEAD's executable bit must be the one
    # the series gives (its mode lines) or, where it sets none, the pristine tag's.
    chmods = []
    for rel, (tagged, head) in sorted(modes.items()):
        given = result.modes.get(rel)
        want = bool(given & 0o111) if given is not None else tagged == b"100755"
        if (head == b"100755") != want:
            chmods.append(f"{series.package}/{rel} ({'+x' if head == b'100755' else '-x'})")
    if chmods:
        raise UsageError(
            "HEAD changes the executable bit of " + ", ".join(chmods[:8]) + ", which no "
            "patch the import writes carries; nothing written",
            hint="commit the file with its mode as the series gives it (`git update-index "
            "--chmod=-x FILE` or `--chmod=+x`), then import again",
        )
    if wrong:
        raise BakeryError(
            f"the series HEAD of {str(repo)!r} makes does not give HEAD's files: "
            + ", ".join(wrong[:8])
            + "; nothing written",
            hint="undo those changes in the repository (a folder made a file, or a file made "
            "a folder), commit, then import again",
        )


def _split_message(message: str) -> tuple[str, str]:
    """A commit message as export writes it (subject, blank line, the description as it
    is, blank line, the ``Bakery-`` trailers): (summary, description), byte for byte. A
    message whose last paragraph is not all trailers (a hand-made one) is read loosely."""
    body = message[:-1] if message.endswith("\n") else message
    head, sep, last = body.rpartition("\n\n")
    if sep and last and all(_ANY_TRAILER.match(line) for line in last.split("\n")):
        subject, _, rest = head.partition("\n")
        return subject, rest[1:] if rest.startswith("\n") else rest
    text = _ANY_TRAILER.sub("", message)
    subject, _, rest = text.strip().partition("\n")
    return subject.strip(), rest.strip()


def _commits(repo: Path) -> list[tuple[str, str]]:
    """(author, message) of each commit after the pristine tag, oldest first, as git
    stores them (``cat-file``: no reformatting, no separator a message could hold)."""
    shas = _git(repo, "rev-list", "--reverse", f"{PRISTINE_TAG}..HEAD").decode().split()
    out = []
    for sha in shas:
        raw = _git(repo, "cat-file", "commit", sha).decode(errors="replace")
        head, _, message = raw.partition("\n\n")
        found = re.search(r"^author (.*) \d+ [+-]\d{4}$", head, re.M)
        out.append((found[1] if found else "", message))
    return out


def _headers_back(series: Series, repo: Path) -> dict[str, dict[str, str]]:
    """Patch file -> the header fields its commit gives back (each commit naming one
    patch: subject, body and author, after a reword), each checked by the series'
    schema (``PatchEntry``) first: a header it refuses is exit 2, nothing written."""
    entries = {e.file: e for e in series.entries}
    found: dict[str, dict[str, str]] = {}
    for author, message in _commits(repo):
        named = _trailers(message, "Patch")
        if len(named) != 1 or named[0] not in entries:
            continue
        summary, description = _split_message(message)
        entry = entries[named[0]]
        new = {
            "summary": summary,
            "description": description,
            "author": author if author != f"{_BOT[0]} <{_BOT[1]}>" else "",
        }
        changed = {k: v for k, v in new.items() if v and getattr(entry, k) != v}
        if not changed:
            continue
        fields = {"file": entry.file, "stage": entry.stage, **entry.header(), **changed}
        decode(
            fields,
            PatchEntry,
            where=f"{repo}: the commit naming {entry.file}",
            error=SeriesError,
            hint="reword the commit (`git rebase -i`, reword), then import again",
        )
        found[entry.file] = changed
    return found


def _write_headers(series: Series, headers: dict[str, dict[str, str]]) -> list[str]:
    if not headers:
        return []
    path = series.root / "series.toml"
    doc = tomlkit.parse(path.read_text())
    tables = {str(t["file"]): t for t in doc.get("patches", [])}
    lines = []
    for file, fields in headers.items():
        for key, value in fields.items():
            tables[file][key] = tomlkit.string(value, multiline="\n" in value)
            lines.append(f"header: {file}: {key}")
    write_atomic(path, tomlkit.dumps(doc).encode())
    return lines
