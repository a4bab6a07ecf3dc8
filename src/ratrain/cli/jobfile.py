"""Job files: a command's options written down as YAML (or TOML), grouped as its help
groups them, and read back (`ratrain train --config FILE`, `--print-config`).

The keys are generated from the argparse parser itself: each argument group (but
argparse's own "options" group, which holds --help, --config and --print-config) is a
section named after its title (up to " ("), and each of its actions is a key named after
its dest. A value is checked as the flag's text would be (the action's type and choices),
so a file, the flags and the help cannot drift apart.

Which options were given explicitly (on the command line, or in a job file) is recorded
by the actions themselves (`track_explicit`): argparse calls an action only for a flag
that is present, never for a default.

    plan:
      model: tiny
      pp: 2
    training:
      lr: 0.003
"""

from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path

from ratrain.errors import RatrainError

__all__ = [
    "track_explicit",
    "explicit_dests",
    "job_sections",
    "read_job_file",
    "apply_job",
    "job_of_args",
    "dump_job",
    "value_of",
    "absolute_paths",
]

_EXPLICIT = "_explicit_dests"
_TRACKED: dict[type, type] = {}


def _tracked(cls: type) -> type:
    """`cls` whose call also records its dest as given explicitly."""
    if cls not in _TRACKED:

        def __call__(self, parser, namespace, values, option_string=None):
            given = getattr(namespace, _EXPLICIT, None)
            if given is None:
                given = set()
                setattr(namespace, _EXPLICIT, given)
            given.add(self.dest)
            cls.__call__(self, parser, namespace, values, option_string)

        _TRACKED[cls] = type(cls.__name__, (cls,), {"__call__": __call__})
    return _TRACKED[cls]


def track_explicit(parser: argparse.ArgumentParser) -> None:
    """Make every option of `parser` record, when given, its dest (`explicit_dests`)."""
    for a in parser._actions:
        if a.dest != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction):
            a.__class__ = _tracked(type(a))


def explicit_dests(args: argparse.Namespace) -> set[str]:
    """The dests given explicitly on the command line (and, once `apply_job` ran, in the
    job file)."""
    return set(getattr(args, _EXPLICIT, None) or ())


def _section_name(title: str) -> str:
    return title.split(" (")[0].strip().replace(" ", "_")


def job_sections(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    """The job file's sections: {section: [actions]}, in the help's order."""
    skip = {id(parser._positionals), id(parser._optionals)}
    out: dict[str, list[argparse.Action]] = {}
    for g in parser._action_groups:
        if id(g) in skip or not g._group_actions:
            continue
        out.setdefault(_section_name(g.title or ""), []).extend(g._group_actions)
    return out


def read_job_file(path: str) -> dict:
    """The mapping a job file holds (YAML; TOML by the suffix .toml), or one line."""
    p = Path(path)
    if p.suffix.lower() == ".toml":
        import tomllib

        try:
            with p.open("rb") as f:
                data = tomllib.load(f)
        except OSError as e:
            raise RatrainError(f"--config {p}: cannot read it ({e.strerror})") from None
        except tomllib.TOMLDecodeError as e:
            raise RatrainError(f"--config {p}: not valid TOML ({e})") from None
    else:
        from ratrain.yaml_io import read_yaml_file

        if p.is_dir():
            raise RatrainError(f"--config {p} is a folder; give a job file (YAML or TOML)")
        data = read_yaml_file(p, "--config")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RatrainError(
            f"--config {p}: expected sections (plan:, training:, ...) of keys, got a "
            f"{type(data).__name__}; see `ratrain train --print-config`"
        )
    return data


_BOOL_ACTIONS = (
    argparse.BooleanOptionalAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
)


def value_of(action: argparse.Action, value, where: str):
    """`value` (from a job file) as the namespace holds it, checked as the flag's text
    would be; None: not given. Errors are one line naming `where`."""
    if value is None:
        return None
    if isinstance(action, _BOOL_ACTIONS):
        if not isinstance(value, bool):
            raise RatrainError(f"{where}: expected true or false, got {value!r}")
        return value
    if isinstance(value, bool) or isinstance(value, dict):
        raise RatrainError(f"{where}: expected a value as {action.option_strings[0]} takes, "
                           f"got {value!r}")  # fmt: skip
    if isinstance(value, (list, tuple)):
        text = ",".join(str(x) for x in value)
    else:
        text = str(value)
    v = text
    if action.type is not None:
        try:
            v = action.type(text)
        except argparse.ArgumentTypeError as e:
            raise RatrainError(f"{where}: {e}") from None
        except (TypeError, ValueError):
            name = getattr(action.type, "__name__", repr(action.type))
            raise RatrainError(f"{where}: invalid {name} value: {text!r}") from None
    if action.choices is not None and v not in action.choices:
        choose = ", ".join(map(str, action.choices))
        raise RatrainError(f"{where}: invalid choice {v!r} (choose from {choose})")
    return v


def apply_job(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    data: dict,
    source: str,
    *,
    keep: set[str] = frozenset(),
    strict: bool = True,
) -> dict[str, object]:
    """Set the options `data` (a job, as sections) gives into `args`, but those in `keep`
    (given on the command line: they win); returns {dest: value} of what it gave (non-null
    values). `strict`: an unknown section or key is an error (else it is skipped: a
    checkpoint's job from another version)."""
    sections = job_sections(parser)
    home = {a.dest: s for s, acts in sections.items() for a in acts}
    given: dict[str, object] = {}
    for sec, keys in data.items():
        if sec not in sections:
            if not strict:
                continue
            raise RatrainError(_unknown(source, str(sec), list(sections), home))
        if keys is None:
            continue
        if not isinstance(keys, dict):
            raise RatrainError(
                f"{source}: {sec}: expected keys (e.g. {sections[sec][0].dest}: ...), got {keys!r}"
            )
        actions = {a.dest: a for a in sections[sec]}
        for key, value in keys.items():
            dest = str(key).replace("-", "_")
            if dest not in actions:
                if not strict:
                    continue
                if dest in home:
                    raise RatrainError(
                        f"{source}: {sec}.{key}: {dest} belongs under {home[dest]}: (move it there)"
                    )
                raise RatrainError(_unknown(source, f"{sec}.{key}", list(actions), {}))
            v = value_of(actions[dest], value, f"{source}: {sec}.{key}")
            if v is None:
                continue
            given[dest] = v
            if dest not in keep:
                setattr(args, dest, v)
    return given


def _unknown(source: str, key: str, known: list[str], home: dict) -> str:
    last = key.rsplit(".", 1)[-1]
    hint = ""
    if last in home:
        hint = f"; {last} is a key of {home[last]}:"
    else:
        close = difflib.get_close_matches(last, known, n=1)
        if close:
            hint = f"; did you mean {close[0]}?"
    return (
        f"{source}: unknown key {key!r}{hint} (the keys are those `ratrain train "
        "--print-config` writes)"
    )


def job_of_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The job `args` holds, as sections of {dest: value} (lists for tuples)."""
    out: dict[str, dict] = {}
    for sec, actions in job_sections(parser).items():
        out[sec] = {}
        for a in actions:
            v = getattr(args, a.dest, None)
            out[sec][a.dest] = list(v) if isinstance(v, tuple) else v
    return out


def dump_job(job: dict, header: str = "") -> str:
    """`job` as YAML, in its order, with `header` as comment lines first."""
    import yaml

    text = yaml.safe_dump(job, sort_keys=False, default_flow_style=False)
    lines = [f"# {x}" if x else "#" for x in header.splitlines()]
    return "".join(x + "\n" for x in lines) + text


def absolute_paths(job: dict, parser: argparse.ArgumentParser, sections) -> dict:
    """`job` with each string value of `sections` that names an existing file or folder
    (and is not the option's default) made absolute: a checkpoint's job resumes from any
    working directory."""
    defaults = {a.dest: a.default for acts in job_sections(parser).values() for a in acts}
    out = {s: dict(keys) for s, keys in job.items()}
    for s in sections:
        for k, v in out.get(s, {}).items():
            if isinstance(v, str) and v != defaults.get(k) and os.path.exists(v):
                out[s][k] = os.path.abspath(v)
    return out
