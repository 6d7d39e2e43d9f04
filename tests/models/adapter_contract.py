"""The contracts every adapter meets, and the checks the family tests share.

- :class:`AdapterContract`: any adapter (subclasses provide an ``adapter`` fixture and
  may override ``seqs``); :class:`RCAverageContract` adds strand invariance.
- :class:`OfficialCodeContract`: equality with the vectors the official code computed
  for a family's fixture models (tests/fixtures/<family>/), as zarr's StoreTests
  share one suite over many stores.
- helpers for what the family modules check alike: reading a fixture folder, seeded
  random-init twins, bf16 closeness, the ``embed`` command in a subprocess.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedcache.hashing import normalise_sequence, reverse_complement
from embedcache.models import load_adapter
from embedcache.models.base import Adapter
from embedcache.specs import ModelKey

REPO = Path(__file__).resolve().parents[2]


# --- helpers ------------------------------------------------------------------------


def raw_sequences(folder: Path) -> list[str]:
    """A fixture folder's ``sequences.txt``, as written (lower case included)."""
    return (folder / "sequences.txt").read_text().split()


def fixture_sequences(folder: Path) -> list[str]:
    """A fixture folder's sequences as the engine hands them over (upper-cased)."""
    return [normalise_sequence(s) for s in raw_sequences(folder)]


def read_expected(folder: Path) -> dict[str, np.ndarray]:
    """The official vectors of a fixture folder (``expected.npz``), by name."""
    with np.load(folder / "expected.npz") as data:
        return {name: data[name] for name in data.files}


def with_random_seqs(edges: list[str], *, seed: int, n: int, max_len: int) -> list[str]:
    """``edges`` and ``n`` random ACGTN sequences of 0 to ``max_len`` - 1 bases."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, max_len, size=n)
    return [*edges, *("".join(rng.choice(list("ACGTN"), size=int(m))) for m in sizes)]


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The smallest cosine similarity between the rows of ``a`` and ``b``."""
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(cosine.min())


def assert_batched_equals_alone(adapter, seqs, *, atol: float) -> None:
    """One padded batch gives each sequence the vector it gets alone."""
    batch = adapter.embed_batch(seqs)
    alone = np.stack([adapter.embed_batch([s])[0] for s in seqs])
    np.testing.assert_allclose(batch, alone, atol=atol, rtol=0)


def seeded_twins(path: str, seqs, *, seeds: tuple[int, int], min_diff: float):
    """Load the random-init twin of ``path`` for two seeds and check the laws every
    family keeps: the same seed gives the same vectors, another seed others, the key
    records the seed and the config. Returns the first seed's adapter."""
    first = load_adapter(path, device="cpu", random_init=seeds[0])
    again = load_adapter(path, device="cpu", random_init=seeds[0])
    other = load_adapter(path, device="cpu", random_init=seeds[1])
    np.testing.assert_array_equal(first.embed_batch(seqs), again.embed_batch(seqs))
    assert np.abs(first.embed_batch(seqs) - other.embed_batch(seqs)).max() > min_diff
    assert first.key.revision == f"random-init:{seeds[0]}"
    assert dict(first.key.options)["config"].startswith("sha256:")
    return first


def embed_cli(
    tmp_path: Path, model: Path, seqs: list[str], *args: str, dtype: str = "float32"
):
    """Run ``embedcache embed --dtype {dtype}`` on ``seqs`` in a subprocess; return
    the last line it printed and the vectors it wrote.

    float32 by default, said on the command line: the vectors are compared with the
    official code's float32 ones, and the command's own default (``auto``) is
    bfloat16 on a CPU with bf16 instructions."""
    (tmp_path / "in.txt").write_text("\n".join(seqs) + "\n")
    out = tmp_path / "out.npy"
    cmd = [sys.executable, "-m", "embedcache.cli", "embed", "--model", str(model)]
    cmd += ["--input", str(tmp_path / "in.txt"), "--output", str(out)]
    cmd += ["--store", str(tmp_path / "store"), "--device", "cpu"]
    cmd += ["--dtype", dtype, *args]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip().splitlines()[-1], np.load(out)


def expected_fixture(folder: Path):
    """A module-scoped ``expected`` fixture: the official vectors of ``folder``."""

    @pytest.fixture(scope="module")
    def expected() -> dict[str, np.ndarray]:
        return read_expected(folder)

    return expected


def variant_fixtures(folder: Path, variants: tuple[str, ...]):
    """Module fixtures ``expected`` (as :func:`expected_fixture`), ``adapters``
    (variant -> adapter with the defaults, loaded once) and ``variant``
    (parametrised over ``variants``)."""

    @pytest.fixture(scope="module")
    def adapters():
        return {v: load_adapter(str(folder / v), device="cpu") for v in variants}

    @pytest.fixture(params=variants)
    def variant(request) -> str:
        return request.param

    return expected_fixture(folder), adapters, variant


def copy_folder(source: Path, tmp_path: Path) -> Path:
    """A copy of the model folder ``source`` under ``tmp_path``, to edit."""
    return Path(shutil.copytree(source, tmp_path / source.name))


def assert_refused(path, error: type[Exception], match: str, **options) -> None:
    """Loading ``path`` (on the CPU, with ``options``) raises ``error``, ``match``."""
    with pytest.raises(error, match=match):
        load_adapter(str(path), device="cpu", **options)


def assert_needs_file(folder: Path, name: str) -> None:
    """Without ``name``, loading ``folder`` is a CheckpointError that names it."""
    from embedcache.errors import CheckpointError

    (folder / name).unlink()
    assert_refused(folder, CheckpointError, f"no {re.escape(name)}")


# options no encoder of fixed, non-k-mer tokens and bidirectional attention takes
ENCODER_REFUSALS = {"kmer-split": {"kmer_split": 3}, "causal": {"pooling": "last"}}


def assert_options_refused(path, refusals: dict[str, dict]) -> None:
    """Each ``{match: options}``: loading ``path`` with the options is an
    AdapterOptionError matching ``match``."""
    from embedcache.errors import AdapterOptionError

    for match, options in refusals.items():
        assert_refused(path, AdapterOptionError, match, **options)


def assert_bfloat16_close(path, seqs, fp32: np.ndarray) -> np.ndarray:
    """``path`` in bfloat16 gives float32 vectors within cosine 0.999 of ``fp32``
    and says bfloat16 in its key; its vectors."""
    adapter = load_adapter(str(path), device="cpu", dtype="bfloat16")
    got = adapter.embed_batch(seqs)
    assert got.dtype == np.float32
    assert adapter.key.dtype == "bfloat16"
    assert min_cosine(fp32, got) > 0.999
    return got


def published_network(path: Path, data: Path, arch_from_config, network_class):
    """A published config's network built on the meta device, its parameter count
    checked against the official count in ``data``/meta.json; (arch, network, counts)."""
    import torch

    config = json.loads(path.read_text())
    counts = json.loads((data / "meta.json").read_text())["published_param_counts"]
    arch = arch_from_config(config, where=path.name)
    with torch.device("meta"):
        network = network_class(arch)
    n_params = sum(p.numel() for p in network.parameters())
    assert n_params == counts[path.name]["encoder_kept"]  # the official encoder's
    return arch, network, counts[path.name]


def edit_config(folder: Path, *, drop=(), **changes) -> None:
    """Change (or ``drop``) fields of ``folder/config.json`` in place."""
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    for key in drop:
        config.pop(key)
    (folder / "config.json").write_text(json.dumps(config))


# --- contracts ----------------------------------------------------------------------


class AdapterContract:
    """Set ``folder`` (and ``options``), or override the ``adapter`` fixture."""

    seqs = ("ACGTACGTAC", "GGGCCCAANT", "A", "TTTTGCA")
    folder: Path
    options: tuple[tuple[str, str], ...] = ()  # load_adapter keywords

    @pytest.fixture(scope="class")
    def adapter(self):
        return load_adapter(str(self.folder), device="cpu", **dict(self.options))

    def test_is_an_adapter(self, adapter):
        assert isinstance(adapter, Adapter)
        assert isinstance(adapter.key, ModelKey)
        assert adapter.key.revision not in {"", "main", "master"}

    def test_shape_and_dtype(self, adapter):
        out = adapter.embed_batch(list(self.seqs))
        assert out.shape == (len(self.seqs), adapter.dim)
        assert out.dtype == np.float32
        assert np.isfinite(out).all()

    def test_deterministic(self, adapter):
        first = adapter.embed_batch(list(self.seqs))
        second = adapter.embed_batch(list(self.seqs))
        np.testing.assert_array_equal(first, second)

    def test_alone_equals_padded_in_batch(self, adapter):
        batch = adapter.embed_batch(list(self.seqs))
        for row, seq in enumerate(self.seqs):
            alone = adapter.embed_batch([seq])
            np.testing.assert_allclose(alone[0], batch[row], atol=1e-5, rtol=0)

    def test_n_tokens_positive_and_monotone_in_length(self, adapter):
        short, long = adapter.n_tokens("ACG"), adapter.n_tokens("ACGACGACG")
        assert 0 < short < long


class RCAverageContract(AdapterContract):
    """An adapter averaging both strands: a sequence and its reverse complement give
    the same vector."""

    rc_seqs = ("ACGTTGCANNAGTCCATG", "GATTACA", "A")
    rc_atol = 1e-5
    options = (("rc_mode", "average"),)

    def test_is_rc_invariant(self, adapter):
        seqs = list(self.rc_seqs)
        fwd = adapter.embed_batch(seqs)
        rev = adapter.embed_batch([reverse_complement(s) for s in seqs])
        np.testing.assert_allclose(fwd, rev, atol=self.rc_atol, rtol=0)


class OfficialCodeContract:
    """Vectors, layers, poolings and tokens equal the official code's.

    The family module provides the fixtures ``variant`` (parametrised over its fixture
    models), ``adapters`` (variant -> adapter with the defaults) and ``expected``
    (:func:`read_expected`); subclasses set ``data`` (the fixture folder),
    ``cli_variant`` and :meth:`special` (the special flags of an encoding).
    """

    data: Path
    cli_variant: str

    def special(self, n_tokens: int) -> tuple[bool, ...]:
        raise NotImplementedError

    def test_matches_official_code(self, adapters, expected, variant):
        got = adapters[variant].embed_batch(fixture_sequences(self.data))
        np.testing.assert_allclose(got, expected[f"{variant}_none"], atol=1e-4, rtol=0)

    def test_rc_average_matches_official_code(self, expected, variant):
        path = str(self.data / variant)
        adapter = load_adapter(path, device="cpu", rc_mode="average")
        assert adapter.key.rc_mode == "average"
        got = adapter.embed_batch(fixture_sequences(self.data))
        want = expected[f"{variant}_average"]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
        pair = got[-3:-1]  # the fixture's exact reverse-complement pair
        np.testing.assert_allclose(pair[0], pair[1], atol=1e-5, rtol=0)

    def test_layers_and_poolings_match_official_hidden_states(self, expected, variant):
        seqs = fixture_sequences(self.data)
        path = str(self.data / variant)
        layered = load_adapter(path, device="cpu", layers=(0, 1, -1))
        got = layered.embed_layers(seqs)
        for row, name in enumerate(("layer0", "layer1", "none")):
            want = expected[f"{variant}_{name}"]
            np.testing.assert_allclose(got[row], want, atol=1e-4, rtol=0)
        assert [k.layer for k in layered.keys] == [0, 1, -1]
        n_layers = layered.network.n_layers
        for name, options in (
            ("none", {"layers": (n_layers,)}),
            ("include", {"special_tokens": "include"}),
            ("cls", {"pooling": "cls"}),
        ):
            adapter = load_adapter(path, device="cpu", **options)
            want = expected[f"{variant}_{name}"]
            np.testing.assert_allclose(
                adapter.embed_batch(seqs), want, atol=1e-4, rtol=0
            )

    def test_fixture_vectors_are_not_degenerate(self, expected):
        for name, vectors in expected.items():
            assert np.isfinite(vectors).all(), name
            assert np.abs(vectors[0] - vectors[-4]).max() > 0.05, name

    def test_token_ids_equal_the_official_tokenizer(self, adapters, variant):
        official = json.loads((self.data / "tokens.json").read_text())[variant]
        ours = adapters[variant].tokenizer.encode_many(fixture_sequences(self.data))
        assert [list(e.ids) for e in ours] == official
        for e in ours:
            assert e.special == self.special(len(e))

    def test_batched_equals_one_by_one(self, adapters, variant):
        seqs = fixture_sequences(self.data)
        assert_batched_equals_alone(adapters[variant], seqs, atol=1e-5)

    @pytest.mark.cpu_kind
    def test_cli_embed_subprocess_equals_official_code(self, expected, tmp_path):
        folder = self.data / self.cli_variant
        assert not list(folder.glob("*.py"))  # no remote code to run, even by accident
        last, got = embed_cli(tmp_path, folder, raw_sequences(self.data))
        assert last == "computed=24 cached=1"
        want = expected[f"{self.cli_variant}_none"]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
