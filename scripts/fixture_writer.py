"""What the official-code fixture scripts (scripts/make_*_fixtures.py) share.

The corner-case sequences and soft-masked long ones several families are checked on,
the reverse complement, moving every weight off its init, the hub layout a
``save_pretrained`` leaves once the copied remote code is removed, the pooled-vector
tables and the padded-batch check of the official code, and writing ``expected.npz``, ``sequences.txt``, ``tokens.json`` and
``meta.json``. The scripts run in a scratch environment with the official code (not
here): this module needs only the standard library until a function is called.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    import numpy as np
    import torch

_COMPLEMENT = str.maketrans("ACGTNacgtn", "TGCANtgcan")

# lengths 1 .. 30, N alone and in runs, lower case; Caduceus and HyenaDNA use these
CORNER_SEQUENCES = [
    "A",
    "GT",
    "ACGTN",
    "acgtA",
    "NNNNNNNN",
    "ACGTACGTAC",
    "TTGCAnnGCA",
    "GATTACAGATTACAGATTACAGATTACA",
    "ccgGGAATTCCNNacgtTTGACAGGCTaa",
    "ACGCGTTAGCATGCAANCGATCGATGCATG",
    "ACGCGTTAGCATGCAANCGATCGATGCATA",
]


# how the fixtures' ``average`` vectors were made, for their meta.json
AVERAGE_UPPER = (
    "(none(seq) + none(reverse_complement(seq))) / 2 on the upper-cased string"
)


def library_versions() -> dict[str, str]:
    """The torch and transformers versions the official code ran on (meta.json)."""
    import torch
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def parse_fixture_args(doc: str, *sources: str) -> argparse.Namespace:
    """The command line of a script whose only options are required folders or
    files: each of ``sources`` (``"--official"``, ...) and ``--out``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    for option in (*sources, "--out"):
        parser.add_argument(option, type=Path, required=True)
    return parser.parse_args()


def reverse_complement(seq: str) -> str:
    """The reverse complement, case kept (N stays N)."""
    return seq.translate(_COMPLEMENT)[::-1]


def random_bases(rng: random.Random, n: int, *, n_run_from: int | None = None) -> str:
    """``n`` random bases with NNN a third of the way in when ``n`` is odd, and a run
    of 11 N half-way when ``n`` is ``n_run_from`` or more."""
    seq = [rng.choice("ACGT") for _ in range(n)]
    if n % 2:
        seq[n // 3 : n // 3 + 3] = "NNN"
    if n_run_from is not None and n >= n_run_from:
        seq[n // 2 : n // 2 + 11] = "N" * 11
    return "".join(seq)


def lower_second_half(text: str) -> str:
    """``text`` with its second half in lower case."""
    half = len(text) // 2
    return text[:half] + text[half:].lower()


def soft_masked(lengths: Iterable[int], *, seed: int = 20261006) -> list[str]:
    """Random sequences of ``lengths`` with a run of 4 N at a third (from 21 bp on)
    and their second half in lower case."""
    rng = random.Random(seed)
    out = []
    for n in lengths:
        seq = [rng.choice("ACGT") for _ in range(n)]
        if n > 20:
            seq[n // 3 : n // 3 + 4] = "NNNN"
        out.append(lower_second_half("".join(seq)))
    return out


def perturb(model: torch.nn.Module, scale: Callable[[str], float]) -> None:
    """Move every parameter off its init (``p += scale(name) * N(0, 1)``), so no
    structure (ones, zeros, ties) can hide a mapping bug."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * scale(name))


def save_hub_layout(
    model: Any,  # noqa: ANN401 - a transformers PreTrainedModel
    out_dir: Path,
    config: dict[str, Any],
    *,
    safe: bool,
) -> None:
    """``save_pretrained`` into a fresh ``out_dir``, without the remote code it
    copies, with ``config`` written as the published ``config.json``."""
    import shutil

    if out_dir.exists():
        shutil.rmtree(out_dir)
    model.save_pretrained(out_dir, safe_serialization=safe)
    for code in out_dir.glob("*.py"):  # save_pretrained copies the remote code
        code.unlink()
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def pooled_views(states: Sequence[torch.Tensor], keep: torch.Tensor) -> dict:
    """One sequence's pooled vectors from its hidden states (a batch of one; ``keep``:
    its tokens that are not special): ``none``, the kept tokens' mean of the last
    layer; ``include``, every token's; ``cls``, position 0; ``layer0``/``layer1``, the
    kept tokens' mean of the first two."""
    return {
        "none": states[-1][0][keep].mean(0).numpy(),
        "include": states[-1][0].mean(0).numpy(),
        "cls": states[-1][0][0].numpy(),
        "layer0": states[0][0][keep].mean(0).numpy(),
        "layer1": states[1][0][keep].mean(0).numpy(),
    }


def pooling_note(what: str) -> str:
    """meta.json's ``pooling`` of :func:`pooled_views`' vectors; ``what``: the mean's
    hidden states and the tokens it leaves out."""
    return (
        f"mean over tokens of {what}; _include keeps them; _cls is position 0; "
        "_layer0/_layer1 pool hidden_states[0]/[1]"
    )


def pooled_table(
    name: str, rows: list[dict], rc_rows: list[dict], whats: Iterable[str]
) -> dict[str, np.ndarray]:
    """``<name>_<what>`` float32 tables from per-sequence pooled vectors, and
    ``<name>_average``: the mean of ``none`` over a sequence and its reverse
    complement."""
    import numpy as np

    out = {
        f"{name}_{what}": np.stack([r[what] for r in rows]).astype(np.float32)
        for what in whats
    }
    out[f"{name}_average"] = np.stack(
        [(a["none"] + b["none"]) / 2 for a, b in zip(rows, rc_rows, strict=True)]
    ).astype(np.float32)
    return out


def check_padded_batch(
    name: str, hidden: torch.Tensor, keep: torch.Tensor, alone: np.ndarray
) -> None:
    """The official code's masked mean over a padded batch equals its one-by-one
    vectors (a check of the reference itself: padding must not leak)."""
    import numpy as np

    keep = keep.unsqueeze(-1)
    padded = ((hidden * keep).sum(1) / keep.sum(1)).numpy()
    gap = float(np.abs(padded - alone).max())
    print(f"{name}: official padded batch vs one by one: max abs diff {gap:.2e}")
    assert gap < 1e-5, gap


def record_official_vectors(
    name: str,
    model: torch.nn.Module,
    tokenizer: Callable[..., Any],
    seqs: list[str],
    *,
    pool: Callable[[str], dict],
    padded_batch: Callable[[list[str]], tuple[dict, torch.Tensor]],
    expected: dict[str, np.ndarray],
    tokens: dict[str, Any],
    whats: Iterable[str] = ("none", "include", "cls", "layer0", "layer1"),
) -> None:
    """Pool each sequence and its reverse complement alone (``pool``) into
    ``expected``, keep the token ids in ``tokens``, and check the official code's
    padded batch (``padded_batch`` gives the batch and its special-token mask)."""
    import torch

    rows = [pool(s) for s in seqs]
    rc_rows = [pool(reverse_complement(s)) for s in seqs]
    expected.update(pooled_table(name, rows, rc_rows, whats))
    tokens[name] = tokenizer(seqs)["input_ids"]
    batch, special = padded_batch(seqs)
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states[-1]
    keep = batch["attention_mask"].bool() & ~special
    check_padded_batch(name, hidden, keep, expected[f"{name}_none"])


def write_fixtures(
    out: Path,
    *,
    expected: dict[str, np.ndarray],
    sequences: list[str],
    meta: dict[str, Any],
    tokens: object = None,
    tokens_indent: int | None = None,
) -> None:
    """``expected.npz``, ``sequences.txt``, ``tokens.json`` (when given) and
    ``meta.json`` in ``out``."""
    import numpy as np

    np.savez(out / "expected.npz", **expected)
    (out / "sequences.txt").write_text("\n".join(sequences) + "\n")
    if tokens is not None:
        text = json.dumps(tokens, indent=tokens_indent)
        (out / "tokens.json").write_text(text + "\n")
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print("wrote", out)


__all__ = [
    "CORNER_SEQUENCES",
    "check_padded_batch",
    "parse_fixture_args",
    "perturb",
    "pooled_table",
    "record_official_vectors",
    "reverse_complement",
    "save_hub_layout",
    "soft_masked",
    "write_fixtures",
]
