"""Settings declared once: flags over EMBEDCACHE_* over serve.toml over defaults,
strict types, unknown keys (and unknown EMBEDCACHE_* variables) refused, model
options beside --config applied or refused, every bad setting one line with its
source."""

from __future__ import annotations

import httpx
import pytest

from embedcache.service import wire
from embedcache.service.errors import ServeConfigError
from embedcache.service.settings import ModelSpec, load_settings
from tests.service.conftest import Server, run_cli

KMER = (ModelSpec(name="kmer-4", model="kmer-4"),)


def config(tmp_path, text):
    path = tmp_path / "serve.toml"
    path.write_text(text)
    return path


def refusal(result):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_a_text_false_for_a_boolean_is_refused_not_taken_as_true(tmp_path):
    path = config(
        tmp_path,
        'host = "0.0.0.0"\nallow_unauthenticated = "false"\n'
        '[[model]]\nmodel = "kmer-4"\n',
    )
    line = refusal(run_cli("serve", "--config", path, "--store", tmp_path / "s"))
    assert "allow_unauthenticated" in line
    assert str(path) in line


def test_a_flag_beside_the_same_setting_in_serve_toml_wins(tmp_path):
    path = config(
        tmp_path,
        f'store = "{tmp_path / "from-config"}"\nmax_sequences = 7\n'
        '[[model]]\nmodel = "kmer-4"\n',
    )
    server = Server(
        ["--config", path, "--store", tmp_path / "from-flag"],
        log_path=tmp_path / "server.log",
        env={"EMBEDCACHE_MAX_SEQUENCES": "5", "EMBEDCACHE_REQUEST_TIMEOUT": "9"},
    )
    try:
        limits = httpx.get(f"{server.url}{wire.ROUTE_MODELS}").json()["limits"]
        reply = httpx.post(
            f"{server.url}{wire.ROUTE_EMBED}",
            json={"model": "kmer-4", "sequences": ["ACGT"]},
        )
    finally:
        assert server.stop() == 0
    assert limits["max_sequences"] == 5  # the environment over serve.toml
    assert reply.status_code == 200
    assert (tmp_path / "from-flag").is_dir()
    assert not (tmp_path / "from-config").exists()
    assert "Traceback" not in server.log()


def test_precedence_flags_environment_config_defaults(tmp_path):
    path = config(tmp_path, "max_sequences = 7\nport = 9001\nmax_body_bytes = 1000\n")
    env = {
        "EMBEDCACHE_MAX_SEQUENCES": "5",
        "EMBEDCACHE_PORT": "9002",
        "EMBEDCACHE_GRACEFUL_TIMEOUT": "12.5",
        "EMBEDCACHE_ALLOW_UNAUTHENTICATED": "true",
    }
    settings = load_settings(
        {"port": 9000, "host": None}, config=path, models=KMER, environ=env
    )
    assert settings.port == 9000  # flag
    assert settings.max_sequences == 5  # environment over serve.toml
    assert settings.max_body_bytes == 1000  # serve.toml
    assert settings.graceful_timeout == 12.5  # environment, read as its type
    assert settings.allow_unauthenticated is True
    assert settings.request_timeout == 300  # default
    assert [spec.name for spec in settings.models] == ["kmer-4"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("max_sequnces = 5\n", ["max_sequnces", "unknown setting"]),
        ("port = 70000\n", ["port", "65535"]),
        ("request_timeout = -1\n", ["request_timeout", "greater than 0"]),
        ('batch_window_ms = "fast"\n', ["batch_window_ms", "'fast'"]),
        (
            '[[model]]\nmodel = "kmer-4"\ntrust_remote_code = "yes"\n',
            ["[[model]] number 1", "trust_remote_code"],
        ),
        ('[[model]]\nmodel = "kmer-4"\ncolour = "red"\n', ["colour", "unknown"]),
    ],
)
def test_a_bad_setting_in_serve_toml_is_named_with_its_source(tmp_path, text, says):
    path = config(tmp_path, text)
    with pytest.raises(ServeConfigError) as caught:
        load_settings({}, config=path, models=KMER, environ={})
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    for word in says:
        assert word in message


def test_bad_flags_and_environment_are_named_by_flag_and_variable():
    with pytest.raises(ServeConfigError, match=r"^--max-sequences: "):
        load_settings({"max_sequences": 0}, models=KMER, environ={})
    env = {"EMBEDCACHE_ALLOW_UNAUTHENTICATED": "maybe"}
    with pytest.raises(
        ServeConfigError, match=r"^\$EMBEDCACHE_ALLOW_UNAUTHENTICATED: "
    ):
        load_settings({}, models=KMER, environ=env)


def test_help_shows_the_declared_defaults():
    result = run_cli("serve", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for shown in (
        "--request-timeout REQUEST_TIMEOUT",
        "(default: 300.0)",
        "(default: 16777216 = 16 Mi)",
        "--allow-unauthenticated",
        "--limit-concurrency",
    ):
        assert shown in text


def test_an_unknown_embedcache_variable_is_refused_like_an_unknown_file_key():
    env = {"EMBEDCACHE_MAX_SEQUNCES": "5", "EMBEDCACHE_REQEST_TIMEOUT": "9"}
    with pytest.raises(ServeConfigError) as caught:
        load_settings({}, models=KMER, environ=env)
    lines = str(caught.value).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("$EMBEDCACHE_MAX_SEQUNCES: unknown setting")
    assert "did you mean $EMBEDCACHE_MAX_SEQUENCES?" in lines[0]
    assert "$EMBEDCACHE_REQUEST_TIMEOUT" in lines[1]
    # the variables other commands read may share a server's environment
    others = {
        "EMBEDCACHE_API_KEY": "k",
        "EMBEDCACHE_SERVER": "http://x",
        "EMBEDCACHE_CLUSTER": "none",
        "EMBEDCACHE_DATA_DIR": "/data",
        "EMBEDCACHE_STORE": "s3://bucket/store",
        # and the process-wide switches the models read
        "EMBEDCACHE_TUNE": "off",
        "EMBEDCACHE_CPU_KIND": "AMX",
    }
    assert load_settings({}, models=KMER, environ=others).store == "s3://bucket/store"


def test_model_options_beside_config_without_a_model_flag_are_refused(tmp_path):
    path = config(tmp_path, '[[model]]\nmodel = "kmer-4"\n')
    store = tmp_path / "s"
    line = refusal(
        run_cli(
            *("serve", "--config", path, "--store", store),
            *("--dtype", "bfloat16", "--layer", "0"),
            timeout=60,
        )
    )
    assert "--dtype, --layer apply to --model models" in line
    assert f"[[model]] table of {path}" in line
    assert not store.exists()


def specs_of(*argv):
    from embedcache.cli import build_parser
    from embedcache.cli.serve import _model_specs

    return _model_specs(build_parser().parse_args(["serve", *map(str, argv)]))


def test_model_flags_apply_to_the_model_flags_beside_config(tmp_path):
    path = config(tmp_path, '[[model]]\nmodel = "kmer-4"\nname = "k4"\n')
    (spec,) = specs_of("--config", path, "--model", "kmer-3", "--dtype", "bfloat16")
    assert spec.name == "kmer-3"
    assert spec.options["dtype"] == "bfloat16"


def test_a_model_flag_and_a_model_table_share_one_set_of_defaults(tmp_path):
    from embedcache.engine.api import embed_options
    from embedcache.models.options import EmbedOptions
    from embedcache.service.settings import ModelTable

    (flag,) = specs_of("--model", "kmer-4")
    table = ModelTable(model="kmer-4").spec()
    resolved = embed_options(flag.model, flag.options)
    assert resolved == embed_options(table.model, table.options) == EmbedOptions()
    assert resolved.dtype == "float32"  # explicit, the same on every kind of CPU
