"""Hugging Face safetensors in and out.

Import (`load_stage_from_hf`): a directory as `save_pretrained` writes it (config.json and
`model.safetensors`, or shards listed in `model.safetensors.index.json`). Each rank opens
the files lazily (`safetensors.safe_open`) and reads only the tensors of its own stage, so
no rank ever holds more than its stage.

Export (`write_hf`): config.json (`ratrain.models.hf_config.to_hf_config`) and safetensors,
split into shards with an index past `max_shard_bytes`, as `save_pretrained` does; with a
tokenizer, its files, `generation_config.json` and the bos/eos token ids in config.json.
Every file gets the mode a new file gets (0644 under umask 022), safetensors included
(its writer creates them 0600).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from ratrain.errors import RatrainError
from ratrain.models.hf_config import from_hf_config, hf_model_type, to_hf_config
from ratrain.models.spec import ModelSpec
from ratrain.nn.hf_weights import ratrain_to_hf_state_dict

__all__ = [
    "hf_model_dir",
    "load_stage_from_hf",
    "hf_tensor_files",
    "write_hf",
    "read_hf_tensors",
    "write_tokenizer",
    "GENERATION_CONFIG",
]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
GENERATION_CONFIG = "generation_config.json"
_UNIT = re.compile(r"^units\.(\d+)\.(.+)$")


_HF_DIR_ADVICE = (
    "pass a Hugging Face model directory (config.json and model.safetensors, or shards with "
    f"{INDEX}, as save_pretrained writes it) or the path to its config.json"
)


def hf_model_dir(path: str | Path, flag: str = "--init-from") -> Path:
    """The Hugging Face model directory `path` names: the directory itself, or the one that
    holds it where it is a config.json. RatrainError (one line, the right advice) unless
    that directory has a config.json and the safetensors: checked before any rank starts."""
    p = Path(path)
    if p.is_file() and p.name == "config.json":
        p = p.parent
    elif p.exists() and not p.is_dir():
        raise RatrainError(f"{flag} {path}: a file, not a model directory; {_HF_DIR_ADVICE}")
    if not p.is_dir():
        raise RatrainError(f"{flag} {path}: directory not found; {_HF_DIR_ADVICE}")
    if not (p / "config.json").is_file():
        raise RatrainError(f"{flag} {path}: config.json not found in it; {_HF_DIR_ADVICE}")
    if not (p / SINGLE).is_file() and not (p / INDEX).is_file():
        raise RatrainError(
            f"{flag} {path}: no {SINGLE} or {INDEX} in {p} (config.json alone gives the model, "
            f"not its weights); {_HF_DIR_ADVICE}"
        )
    return p


def hf_tensor_files(d: str | Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it."""
    d = Path(d)
    if (d / INDEX).is_file():
        try:
            weight_map = json.loads((d / INDEX).read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RatrainError(f"{d / INDEX}: not a safetensors index ({e})") from None
        files = {k: d / v for k, v in weight_map.items()}
        missing = sorted({str(f) for f in files.values() if not f.is_file()})
        if missing:
            raise RatrainError(f"{d}: shard {missing[0]} listed in {INDEX} is missing")
        return files
    if (d / SINGLE).is_file():
        with _open(d / SINGLE) as f:
            return {k: d / SINGLE for k in f.keys()}
    raise RatrainError(f"{d}: no {SINGLE} or {INDEX}; pass a save_pretrained directory")


def _open(path: Path):
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # safetensors raises its own error types for a damaged header
        raise RatrainError(f"{path}: not a readable safetensors file ({e})") from None


def _source_of(name: str, spec: ModelSpec, mt: str) -> tuple[str, slice | None]:
    """The HF tensor (and row slice, for Baichuan's fused W_pack) of a ratrain weight."""
    m = _UNIT.match(name)
    assert m, name
    unit, rest = int(m.group(1)), m.group(2)
    L = spec.n_layers
    if unit == 0:
        return "model.embed_tokens.weight", None
    if unit == L + 1:
        return ("model.norm.weight" if rest == "norm.weight" else "lm_head.weight"), None
    base = f"model.layers.{unit - 1}."
    if mt == "baichuan" and rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                     "self_attn.v_proj.weight"):  # fmt: skip
        h, kv = spec.hidden, spec.kv_dim
        rows = {"q": slice(0, h), "k": slice(h, h + kv), "v": slice(h + kv, h + 2 * kv)}
        return base + "self_attn.W_pack.weight", rows[rest.split(".")[1][0]]
    return base + rest, None


def read_hf_tensors(d: str | Path, spec: ModelSpec, names: list[str]) -> dict[str, torch.Tensor]:
    """fp32 tensors for the given ratrain weight names, read lazily from HF safetensors."""
    d = Path(d)
    mt = json.loads((d / "config.json").read_text()).get("model_type") or hf_model_type(spec)
    files = hf_tensor_files(d)
    wanted: dict[Path, list[tuple[str, str, slice | None]]] = {}
    for name in names:
        key, rows = _source_of(name, spec, mt)
        if key == "lm_head.weight" and key not in files and spec.tied_embeddings:
            key = "model.embed_tokens.weight"  # tied checkpoints may omit the head
        if key not in files:
            raise RatrainError(f"{d}: no tensor {key!r} (needed for {name}) in the safetensors")
        wanted.setdefault(files[key], []).append((name, key, rows))
    out: dict[str, torch.Tensor] = {}
    for path, items in wanted.items():
        with _open(path) as f:
            for name, key, rows in items:
                t = f.get_slice(key)[rows] if rows is not None else f.get_tensor(key)
                out[name] = t.to(torch.float32)
    return out


def load_stage_from_hf(model, hf_dir: str | Path) -> None:
    """Set a `StageModel`'s masters (and views) from HF weights, its own stage's only.
    `hf_dir` is the model directory or its config.json (`hf_model_dir`)."""
    from ratrain.checkpoint.state import StageIO, param_names

    hf_dir = hf_model_dir(hf_dir)
    spec = from_hf_config(hf_dir)
    if spec != model.spec:
        raise RatrainError(f"--init-from {hf_dir}: its config.json is not the model being trained")
    names = [n for st in model.units.values() for n in param_names(st)]
    tensors = read_hf_tensors(hf_dir, spec, names)
    shapes = {n: tuple(p.shape) for st in model.units.values()
              for n, p in zip(param_names(st), st.params, strict=True)}  # fmt: skip
    for n, t in tensors.items():
        if tuple(t.shape) != shapes[n]:
            raise RatrainError(
                f"--init-from {hf_dir}: {n} has shape {tuple(t.shape)}, the config says "
                f"{shapes[n]}; the weights do not match config.json"
            )
    StageIO(model).apply({f"model/{n}": t for n, t in tensors.items()})


def write_tokenizer(tokenizer: str | Path, out_dir: str | Path) -> tuple[dict, list[Path]]:
    """Copy a tokenizer into an HF model directory, with generation_config.json (and a
    tokenizer_config.json naming its special tokens when it has none, so that
    `AutoTokenizer.from_pretrained` reads it); its (bos_token_id, eos_token_id) and the
    files written."""
    from ratrain.data.text import HFTokenizer, copy_tokenizer

    tok = HFTokenizer(Path(tokenizer))
    out = Path(out_dir)
    ids = tok.special_ids()
    files = copy_tokenizer(tok.path, out)
    if not (out / "tokenizer_config.json").is_file():
        names = {k: tok.token(v) for k, v in (("bos_token", ids["bos_token_id"]),
                                              ("eos_token", ids["eos_token_id"])) if v is not None}  # fmt: skip
        cfg = {"tokenizer_class": "PreTrainedTokenizerFast", **names}
        (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        files.append(out / "tokenizer_config.json")
    gen = {k: v for k, v in ids.items() if v is not None}
    (out / GENERATION_CONFIG).write_text(json.dumps(gen, indent=2) + "\n")
    return ids, [*files, out / GENERATION_CONFIG]


def _shards(hf: dict[str, torch.Tensor], max_shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, v in hf.items():
        n = v.numel() * v.element_size()
        if shards[-1] and size + n > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += n
    return shards


def write_hf(
    sd: dict[str, torch.Tensor],
    spec: ModelSpec,
    out_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    max_shard_bytes: int = 5 * 2**30,
    tokenizer: str | Path | None = None,
) -> list[Path]:
    """Write a `LlamaModel` state dict as a Hugging Face directory (and `tokenizer`'s files,
    see `write_tokenizer`); the files written."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    to_hf_config(spec)  # a spec transformers cannot read is one line before any file
    hf = ratrain_to_hf_state_dict(sd, spec)
    if spec.tied_embeddings:
        hf.pop("lm_head.weight", None)  # transformers ties it; safetensors refuses aliases
    hf = {k: v.detach().to(dtype).contiguous() for k, v in hf.items()}
    shards = _shards(hf, max_shard_bytes)
    out.mkdir(parents=True, exist_ok=True)
    # A previous export's weights would be mixed with these (e.g. an old index beside a new
    # single file): remove them first.
    for stale in [*out.glob("model-*-of-*.safetensors"), out / SINGLE, out / INDEX]:
        stale.unlink(missing_ok=True)
    ids, written = write_tokenizer(tokenizer, out) if tokenizer is not None else ({}, [])
    cfg = to_hf_config(spec, ids)
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    written = [out / "config.json", *written]
    meta = {"format": "pt"}
    names = [SINGLE] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))
    ]  # fmt: skip
    for name, shard in zip(names, shards, strict=True):
        save_file(shard, str(out / name), metadata=meta)
        (out / name).chmod((out / "config.json").stat().st_mode & 0o777)  # as umask says
        written.append(out / name)
    if len(shards) > 1:
        weight_map = {k: name for name, shard in zip(names, shards, strict=True) for k in shard}
        total = sum(v.numel() * v.element_size() for v in hf.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        written.append(out / INDEX)
    return written
