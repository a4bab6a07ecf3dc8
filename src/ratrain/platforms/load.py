"""Read a platform file (YAML, schema in `ratrain.platforms`) into a `Platform`.

Every number in a platform file is a mapping ``{value: ..., note: ...}`` whose note says
where the value comes from: ``sourced: <where>``, ``derived: <how>`` (arithmetic on
sourced or assumed figures), ``assumed: <why>`` or ``measured: <what, how, when, on what>``
(written by `ratrain calibrate`). A value without such a note is an error:
a cost model is only as good as what it can say about its constants.

Sizes are bytes, bandwidths bytes/s, times seconds. Link bandwidths are what *one* compute
unit gets when every unit of its node communicates at once (a shared NIC is divided by the
units that share it). The last tier is main memory; its bandwidth is main memory's
streaming bandwidth (what memory-bound work such as the optimizer step sees).
"""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from ratrain.errors import RatrainError
from ratrain.platforms import Link, Platform, Tier
from ratrain.platforms.host import check_host
from ratrain.yaml_io import load_yaml

__all__ = [
    "PLATFORM_PRESETS",
    "PRESETS_DIR",
    "COLLECTIVE_ALGORITHMS",
    "from_dict",
    "load",
    "parse_platform",
]

PRESETS_DIR = Path(__file__).parent
"""Where the preset platform files are."""
PLATFORM_PRESETS = ("mt3000", "a100-80g", "h100-80g", "cpu-local")
COLLECTIVE_ALGORITHMS = ("ring", "tree", "hierarchical")
_NOTE_PREFIXES = ("sourced", "derived", "assumed", "measured")
_TOP = {
    "name",
    "description",
    "usable_memory_bytes",
    "workspace_bytes",
    "headroom_fraction",
    "compute",
    "tiers",
    "host",
    "network",
    "runtime",
    "measured_on",
    "calibration_warnings",
}
_LINK = ("bandwidth_bytes_per_s", "latency_s", "efficiency")
_TIER = ("capacity_bytes", "bandwidth_bytes_per_s", "latency_s", "copies")


class _Reader:
    """Walks the parsed YAML, collecting provenance notes and raising one-line errors."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.notes: dict[str, str] = {}

    def fail(self, msg: str) -> RatrainError:
        return RatrainError(f"platform {self.source}: {msg}")

    def section(self, d: dict, key: str, path: str) -> dict:
        if key not in d:
            raise self.fail(f"missing field {path + key}")
        v = d[key]
        if not isinstance(v, dict):
            raise self.fail(f"{path + key} must be a mapping")
        return v

    def raw(self, d: dict, key: str, path: str):
        """The `{value, note}` entry at d[key]: returns the value, records the note."""
        dotted = path + key
        if key not in d:
            raise self.fail(f"missing field {dotted}")
        entry = d[key]
        if not isinstance(entry, dict) or "value" not in entry:
            raise self.fail(
                f"{dotted} must be {{value: ..., note: 'sourced: ...' or 'assumed: ...'}}"
            )
        note = entry.get("note")
        if not isinstance(note, str) or not note.strip().lower().startswith(_NOTE_PREFIXES):
            raise self.fail(
                f"{dotted} has no provenance note; add note: 'sourced: <where>', "
                "'assumed: <why>' or 'measured: <what, how, when, on what>'"
            )
        extra = set(entry) - {"value", "note"}
        if extra:
            raise self.fail(f"{dotted}: unknown key(s) {sorted(extra)}; expected value and note")
        self.notes[dotted] = note.strip()
        return entry["value"]

    def number(
        self,
        d: dict,
        key: str,
        path: str,
        *,
        integer: bool = False,
        upper: float | None = None,
        zero: bool = False,
    ):
        return self.check_number(self.raw(d, key, path), path + key, integer, upper, zero)

    def check_number(self, v, dotted: str, integer=False, upper=None, zero=False):
        if isinstance(v, str):  # YAML 1.1 reads 20.0e9 (no exponent sign) as a string
            try:
                v = float(v)
            except ValueError:
                raise self.fail(f"{dotted} must be a number, got {v!r}") from None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(f"{dotted} must be a number, got {v!r}")
        if not (v >= 0 if zero else v > 0):
            raise self.fail(f"{dotted} must be {'>= 0' if zero else 'positive'}, got {v!r}")
        if v == float("inf"):  # an infinite size or rate overflows where it is rounded
            raise self.fail(f"{dotted} must be a finite number, got {v!r}")
        if upper is not None and v > upper:
            raise self.fail(f"{dotted} must be at most {upper}, got {v!r}")
        if integer:
            if float(v) != int(v):
                raise self.fail(f"{dotted} must be a whole number, got {v!r}")
            return int(v)
        return float(v)

    def link(self, d: dict, key: str, path: str) -> Link:
        sec = self.section(d, key, path)
        p = f"{path}{key}."
        return Link(
            bandwidth_bytes_per_s=self.number(sec, "bandwidth_bytes_per_s", p),
            latency_s=self.number(sec, "latency_s", p),
            efficiency=self.number(sec, "efficiency", p, upper=1.0) if "efficiency" in sec else 1.0,
        )

    def tier(self, t, i: int) -> Tier:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise self.fail(f"tiers[{i}] must be a mapping with a name")
        p = f"tiers.{t['name']}."
        unknown = set(t) - {"name", *_TIER}
        if unknown:
            raise self.fail(
                f"{p[:-1]}: unknown field(s) {sorted(unknown)}; known: name, {', '.join(_TIER)}"
            )
        return Tier(
            name=t["name"],
            capacity_bytes=self.number(t, "capacity_bytes", p, integer=True),
            bandwidth_bytes_per_s=self.number(t, "bandwidth_bytes_per_s", p),
            latency_s=self.number(t, "latency_s", p),
            copies=self.number(t, "copies", p, integer=True) if "copies" in t else 1,
        )

    def table(
        self, d: dict, key: str, path: str, width: int, zero_cols: tuple[int, ...] = ()
    ) -> tuple[tuple[float, ...], ...]:
        """A list of `width`-number rows, sorted by their first column; numbers positive,
        except in `zero_cols` (>= 0)."""
        rows, dotted = self.raw(d, key, path), path + key
        if not isinstance(rows, list) or not rows:
            raise self.fail(f"{dotted} must be a non-empty list of [{width} numbers] rows")
        out = []
        for i, row in enumerate(rows):
            if not isinstance(row, list) or len(row) != width:
                raise self.fail(f"{dotted}[{i}] must be a list of {width} numbers")
            out.append(
                tuple(
                    self.check_number(v, f"{dotted}[{i}]", zero=j in zero_cols)
                    for j, v in enumerate(row)
                )
            )
        return tuple(sorted(out))

    def entries(self, d: dict, key: str, path: str, **kw) -> dict[str, float]:
        """An optional mapping of names to `{value, note}` numbers."""
        if key not in d:
            return {}
        sec = self.section(d, key, path)
        return {str(k): self.number(sec, k, f"{path}{key}.", **kw) for k in sec}


def _shared_rows(r: _Reader, compute: dict) -> tuple:
    """compute.shared_rank_speed: rows [w, b, speed] or [w, b, speed, burst seconds]."""
    entry = compute["shared_rank_speed"]
    value = entry.get("value") if isinstance(entry, dict) else None
    first = value[0] if isinstance(value, list) and value else None
    width = 4 if isinstance(first, list) and len(first) == 4 else 3
    rows = r.table(compute, "shared_rank_speed", "compute.", width)
    out = []
    for w, b, speed, *burst in rows:
        if not (w == int(w) and b == int(b) and 1 <= b < w):
            raise r.fail(
                "compute.shared_rank_speed: rows are [w ranks, b < w busy, speed] or [w, b, "
                f"speed, burst seconds] with whole counts, got [{w:g}, {b:g}, ...]"
            )
        if burst and not burst[0] > 0:
            raise r.fail(
                f"compute.shared_rank_speed: a row's burst seconds must be > 0, got {burst[0]!r}"
            )
        out.append((int(w), int(b), speed, *burst))
    return tuple(sorted(out, key=lambda x: (x[0], x[1], x[3] if len(x) > 3 else 0.0)))


def _optional(r: _Reader, data: dict, compute: dict, net: dict) -> dict:
    """The optional measured sections (see `ratrain.platforms`): absent ones keep defaults."""
    out: dict = {}
    curves = (
        r.section(compute, "efficiency_curves", "compute.")
        if "efficiency_curves" in compute
        else {}
    )
    out["efficiency_curves"] = {
        str(k): r.table(curves, k, "compute.efficiency_curves.", 2) for k in curves
    }
    out["memory_bound_bytes_per_s"] = r.entries(compute, "memory_bound_bytes_per_s", "compute.")
    out["unit_time_factor"] = r.entries(compute, "unit_time_factor", "compute.")
    out["unit_fixed_s"] = r.entries(compute, "unit_fixed_s", "compute.", zero=True)
    if "collective_compute_s_per_byte" in compute:
        out["collective_compute_s_per_byte"] = r.number(
            compute, "collective_compute_s_per_byte", "compute.", zero=True
        )
    if "rank_speed" in compute:
        rows = r.table(compute, "rank_speed", "compute.", 2)
        out["rank_speed"] = tuple((int(k), v) for k, v in rows)
    if "rank_speed_tokens" in compute:
        rows = r.table(compute, "rank_speed_tokens", "compute.", 3)
        for k, n, _ in rows:
            if not (k == int(k) and n == int(n) and k >= 1 and n >= 1):
                raise r.fail(
                    "compute.rank_speed_tokens: rows are [k ranks, tokens per microbatch, "
                    f"speed] with whole counts, got [{k:g}, {n:g}, ...]"
                )
        out["rank_speed_tokens"] = tuple(sorted((int(k), int(n), v) for k, n, v in rows))
    if "shared_rank_speed" in compute:
        out["shared_rank_speed"] = _shared_rows(r, compute)
    if "cores_per_node" in compute:
        out["cores_per_node"] = r.number(compute, "cores_per_node", "compute.", integer=True)
    if "units_sharing_cores" in compute:
        out["units_sharing_cores"] = r.number(
            compute, "units_sharing_cores", "compute.", integer=True
        )
    if "thread_efficiency" in compute:
        out["thread_efficiency"] = r.number(compute, "thread_efficiency", "compute.", upper=1.0)
    rt = r.section(data, "runtime", "") if "runtime" in data else {}
    known = (
        "action_overhead_s",
        "eager_kernels",
        "sends_held_until_waited",
        "waiting_ranks_lend_cores",
    )
    unknown = set(rt) - set(known)
    if unknown:
        raise r.fail(f"runtime: unknown field(s) {sorted(unknown)}; known: {', '.join(known)}")
    out["action_overhead_s"] = r.entries(rt, "action_overhead_s", "runtime.", zero=True)
    if "eager_kernels" in rt:
        eager = r.raw(rt, "eager_kernels", "runtime.")
        if not isinstance(eager, bool):
            raise r.fail(f"runtime.eager_kernels must be true or false, got {eager!r}")
        out["eager_kernels"] = eager
    if "sends_held_until_waited" in rt:
        held = r.raw(rt, "sends_held_until_waited", "runtime.")
        if not isinstance(held, bool):
            raise r.fail(f"runtime.sends_held_until_waited must be true or false, got {held!r}")
        out["sends_held_until_waited"] = held
    if "waiting_ranks_lend_cores" in rt:
        lend = r.raw(rt, "waiting_ranks_lend_cores", "runtime.")
        if not isinstance(lend, bool):
            raise r.fail(f"runtime.waiting_ranks_lend_cores must be true or false, got {lend!r}")
        out["waiting_ranks_lend_cores"] = lend
    coll = r.section(net, "collectives", "network.") if "collectives" in net else {}
    tables = {}
    for kind in coll:
        rows = r.table(coll, kind, "network.collectives.", 3, zero_cols=(1,))  # α may be 0
        tables[str(kind)] = tuple((int(n), a, b) for n, a, b in rows)
    out["collectives"] = tables
    out.update(_links(r, net))
    if "measured_on" in data:
        sec = r.section(data, "measured_on", "")
        cpu = r.raw(sec, "cpu", "measured_on.")
        out["measured_on"] = {
            "cpu": str(cpu),
            "cores": r.number(sec, "cores", "measured_on.", integer=True),
        }
        if "speed_probe_s" in sec:  # the speed probe's time (`ratrain.calibrate.probe`)
            out["measured_on"]["speed_probe_s"] = r.number(sec, "speed_probe_s", "measured_on.")
    return out


def _links(r: _Reader, net: dict) -> dict:
    """network.links (optional, `ratrain.cost.links`): `full_duplex` (true/false),
    `notice_queue_s` (seconds, >= 0), `cpu_s_per_byte` (>= 0) and what `ratrain
    link-probe` measured (numbers, kept for the record)."""
    if "links" not in net:
        return {}
    sec = r.section(net, "links", "network.")
    out: dict = {"link_measured": {}}
    for key in sec:
        value = r.raw(sec, key, "network.links.")
        if key == "full_duplex":
            if not isinstance(value, bool):
                raise r.fail(f"network.links.full_duplex must be true or false, got {value!r}")
            out["link_full_duplex"] = value
        elif key == "notice_queue_s":
            out["link_notice_queue_s"] = r.check_number(
                value, "network.links.notice_queue_s", zero=True
            )
        elif key == "cpu_s_per_byte":
            out["link_cpu_s_per_byte"] = r.check_number(
                value, "network.links.cpu_s_per_byte", zero=True
            )
        else:
            out["link_measured"][str(key)] = r.check_number(value, f"network.links.{key}")
    return out


def parse_platform(data, source: str) -> Platform:
    r = _Reader(source)
    if not isinstance(data, dict):
        raise r.fail("expected a mapping at the top level")
    unknown = set(data) - _TOP
    if unknown:
        raise r.fail(f"unknown field(s) {sorted(unknown)}; known: {', '.join(sorted(_TOP))}")
    warns = data.get("calibration_warnings", [])
    if not isinstance(warns, list) or not all(isinstance(w, str) for w in warns):
        raise r.fail("calibration_warnings must be a list of strings")
    name = data.get("name")
    if name is None:
        raise r.fail("missing field name")
    if not isinstance(name, str) or not name:
        raise r.fail(f"name must be a non-empty string, got {name!r}")
    compute = r.section(data, "compute", "")
    peaks = r.section(compute, "peak_flops", "compute.")
    peak_flops = {dt: r.number(peaks, dt, "compute.peak_flops.") for dt in ("fp16", "bf16", "fp32")}
    tiers_raw = data.get("tiers")
    if not isinstance(tiers_raw, list) or not tiers_raw:
        raise r.fail("tiers must be a non-empty list, fastest first, main memory last")
    tiers = tuple(r.tier(t, i) for i, t in enumerate(tiers_raw))
    if len({t.name for t in tiers}) != len(tiers):
        raise r.fail("tier names must be unique")
    net = r.section(data, "network", "")
    algorithm = r.raw(net, "algorithm", "network.")
    if algorithm not in COLLECTIVE_ALGORITHMS:
        raise r.fail(
            f"unknown collective algorithm {algorithm!r}; choose one of {', '.join(COLLECTIVE_ALGORITHMS)}"
        )
    host = r.section(data, "host", "")
    same = r.raw(host, "same_memory", "host.") if "same_memory" in host else False
    if not isinstance(same, bool):
        raise r.fail(f"host.same_memory must be true or false, got {same!r}")
    usable = r.number(data, "usable_memory_bytes", "", integer=True)
    workspace = r.number(data, "workspace_bytes", "", integer=True, zero=True)
    if workspace >= usable:
        raise r.fail(f"workspace_bytes ({workspace}) must be below usable_memory_bytes ({usable})")
    headroom = 0.0
    if "headroom_fraction" in data:
        headroom = r.number(data, "headroom_fraction", "", zero=True, upper=0.9)
    return Platform(
        name=name,
        usable_memory_bytes=usable,
        workspace_bytes=workspace,
        headroom_fraction=headroom,
        peak_flops=peak_flops,
        efficiency=r.number(compute, "efficiency", "compute.", upper=1.0),
        tiers=tiers,
        host=Link(
            bandwidth_bytes_per_s=r.number(host, "bandwidth_bytes_per_s", "host."),
            latency_s=r.number(host, "latency_s", "host."),
        ),
        host_is_main_memory=same,
        intra_node=r.link(net, "intra_node", "network."),
        inter_node=r.link(net, "inter_node", "network."),
        units_per_node=r.number(net, "units_per_node", "network.", integer=True),
        collective_algorithm=algorithm,
        **_optional(r, data, compute, net),
        notes=r.notes,
        description=str(data.get("description", "")).strip(),
    )


def _read(path: Path) -> Platform:
    try:
        data = load_yaml(path.read_text())
    except yaml.YAMLError as e:
        raise RatrainError(f"platform {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    except UnicodeDecodeError:
        raise RatrainError(f"platform {path}: not a text file (not UTF-8)") from None
    except OSError as e:
        raise RatrainError(f"platform {path}: cannot read it ({e.strerror})") from None
    return parse_platform(data, str(path))


def from_dict(data: dict, source: str = "a platform mapping") -> Platform:
    """A platform from its YAML mapping (as a platform file holds it), checked as a file's;
    `source` names it in errors."""
    return parse_platform(data, source)


@functools.cache
def _preset(name: str) -> Platform:
    return _read(PRESETS_DIR / f"{name}.yaml")


def _checked(p: Platform) -> Platform:
    check_host(p.name, p.measured_on)
    return p


def load(name_or_path: str | Path | Platform) -> Platform:
    """A preset name (see `PLATFORM_PRESETS`), a path to a platform YAML file, or a `Platform`."""
    if isinstance(name_or_path, Platform):
        return name_or_path
    text = str(name_or_path)
    if text in PLATFORM_PRESETS:
        return _checked(_preset(text))
    p = Path(text)
    if p.is_file():
        return _checked(_read(p))
    if p.suffix in (".yaml", ".yml", ".json") or "/" in text:
        raise RatrainError(f"platform file {text!r} not found")
    raise RatrainError(
        f"unknown platform preset {text!r}; choose one of {', '.join(PLATFORM_PRESETS)} "
        "or pass a path to a platform YAML file"
    )
