"""Settings parsed from ``BOTMEMORY_*`` variables (services/settings.py): JSON-valued settings,
bounds, master keys and the local secret files. Every test starts from an environment without
any ``BOTMEMORY_*`` or ``OPENAI_*`` variable, so the caller's shell cannot change the outcome."""

from __future__ import annotations

import base64
import multiprocessing
import os
import re
import threading
import traceback
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError
from pydantic_settings import SettingsError

from botmemory import cli
from services import settings as settings_module
from services.settings import ConfigurationError, ModelPrice, Settings, decode_key, load_settings

KEY = base64.b64encode(bytes(range(32))).decode()
OLD_KEY = base64.b64encode(b"\x09" * 32).decode()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.upper().startswith(("BOTMEMORY_", "OPENAI_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("BOTMEMORY_DATA_DIR", str(tmp_path))


def test_the_documented_deadlines_are_the_defaults() -> None:
    s = Settings()
    assert (s.env, s.answer_deadline_seconds, s.step_deadline_seconds) == ("local", 15.0, 120.0)  # D9.11
    assert s.model_prices == {} and s.previous_master_keys == []
    assert s.embedder == "local" and s.embedding_dimensions is None


def test_variables_are_read_with_their_prefix_and_types(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOTMEMORY_ENV", "production")
    monkeypatch.setenv("BOTMEMORY_API_PORT", "18000")
    monkeypatch.setenv("BOTMEMORY_ANSWER_DEADLINE_SECONDS", "3.5")
    monkeypatch.setenv("BOTMEMORY_EMBEDDER", "none")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # no prefix: the OpenAI client's names
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("BOTMEMORY_NOT_A_SETTING", "ignored")
    s = Settings()
    assert (s.env, s.api_port, s.answer_deadline_seconds, s.embedder) == ("production", 18000, 3.5, "none")
    assert s.openai_base_url == "http://127.0.0.1:9/v1"
    assert s.openai_api_key is not None and s.openai_api_key.get_secret_value() == "sk-secret"
    assert "sk-secret" not in repr(s)


def test_model_prices_are_json_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "BOTMEMORY_MODEL_PRICES",
        '{"gpt-4o-mini": {"input": 150000, "output": 600000}, "*": {"input": 0, "output": 1}}',
    )
    assert Settings().model_prices == {
        "gpt-4o-mini": ModelPrice(input=150000, output=600000),
        "*": ModelPrice(input=0, output=1),
    }


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("BOTMEMORY_ENV", "staging"),
        ("BOTMEMORY_API_PORT", "http"),
        ("BOTMEMORY_MODEL_PRICES", '{"m": {"input": -1, "output": 0}}'),
        ("BOTMEMORY_MODEL_PRICES", '{"m": {"input": 1}}'),
        ("BOTMEMORY_MODEL_PRICES", "not json"),
        ("BOTMEMORY_EMBEDDER", "remote"),
        ("BOTMEMORY_EMBEDDING_DIMENSIONS", "0"),
        ("BOTMEMORY_EMBEDDING_THREADS", "0"),
        ("BOTMEMORY_EMBEDDING_BATCH", "0"),
        ("BOTMEMORY_INDEX_THREADS", "0"),
        ("BOTMEMORY_INDEX_MEMORY_MB", "0"),
        # Accepted before: a lease of 0 renewed itself in a tight loop, a sweep interval of 0
        # swept without pause, no attempts called no model, port 99999 failed at bind.
        ("BOTMEMORY_LEASE_SECONDS", "0"),
        ("BOTMEMORY_SLOT_LEASE_SECONDS", "-1"),
        ("BOTMEMORY_SWEEP_INTERVAL_SECONDS", "0"),
        ("BOTMEMORY_REQUEUE_AFTER_SECONDS", "-5"),
        ("BOTMEMORY_MODEL_MAX_ATTEMPTS", "0"),
        ("BOTMEMORY_ANSWER_DEADLINE_SECONDS", "0"),
        ("BOTMEMORY_MAX_PAGE_SIZE", "0"),
        ("BOTMEMORY_API_PORT", "99999"),
        ("BOTMEMORY_REDIS_PORT", "0"),
        # Accepted before: logging refused it later, in a traceback that did not name it; the JVM
        # refused the heap with "A fatal exception has occurred".
        ("BOTMEMORY_LOG_LEVEL", "verbose"),
        ("BOTMEMORY_NEO4J_HEAP", "1gb"),
        ("BOTMEMORY_NEO4J_PAGECACHE", "lots"),
    ],
)
def test_bad_values_refuse_to_start(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises((ValidationError, SettingsError)):  # SettingsError: not JSON at all
        Settings()


def test_previous_master_keys_are_a_json_list_of_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOTMEMORY_MASTER_KEY", KEY)
    monkeypatch.setenv("BOTMEMORY_PREVIOUS_MASTER_KEYS", f'["{OLD_KEY}"]')
    s = Settings()
    assert s.master_key_bytes() == bytes(range(32))
    assert s.previous_master_key_bytes() == [b"\x09" * 32]
    assert KEY not in repr(s) and OLD_KEY not in repr(s)


@pytest.mark.parametrize(
    "value", [f'"{OLD_KEY}"', f'{{"k": "{OLD_KEY}"}}', f'["{OLD_KEY}", 5]', OLD_KEY, f"[{OLD_KEY}]"]
)
def test_a_secret_of_the_wrong_shape_is_named_never_quoted(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """BOTMEMORY_PREVIOUS_MASTER_KEYS as one JSON string (what tools that encode one value make) or
    an object: pydantic checks the list before the secret, and its error quoted the key — in the
    traceback of a process that would not start, in its log. The setting is named, not quoted."""
    monkeypatch.setenv("BOTMEMORY_MASTER_KEY", KEY)
    monkeypatch.setenv("BOTMEMORY_PREVIOUS_MASTER_KEYS", value)
    with pytest.raises(ConfigurationError) as raised:
        load_settings()
    told = "".join(traceback.format_exception(raised.value))
    assert "previous_master_keys" in told.lower()  # a bare key is not JSON: SettingsError before
    assert OLD_KEY not in told and OLD_KEY[:12] not in told


def test_rotate_master_key_names_a_key_of_the_wrong_shape_never_quotes_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``botmemory rotate-master-key`` read its settings without that care: INTERNAL, and with
    ``--debug`` (which its message advised) the traceback quoted the old key."""
    monkeypatch.setenv("BOTMEMORY_MASTER_KEY", KEY)
    monkeypatch.setenv("BOTMEMORY_PREVIOUS_MASTER_KEYS", f'"{OLD_KEY}"')
    assert cli.main(["rotate-master-key"]) == 1
    said = capsys.readouterr().err
    assert said.startswith("botmemory: CONFIGURATION: ") and "PREVIOUS_MASTER_KEYS" in said.upper()
    monkeypatch.setenv("BOTMEMORY_DEBUG", "1")
    with pytest.raises(ConfigurationError) as raised:
        cli.main(["rotate-master-key"])
    assert OLD_KEY[:12] not in "".join(traceback.format_exception(raised.value))


def test_an_empty_variable_is_an_unset_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """``BOTMEMORY_PREVIOUS_MASTER_KEYS=`` (the old key dropped by blanking it) failed to parse
    as a list, and every process failed to start."""
    monkeypatch.setenv("BOTMEMORY_PREVIOUS_MASTER_KEYS", "")
    monkeypatch.setenv("BOTMEMORY_MASTER_KEY", "")
    s = load_settings()
    assert s.previous_master_keys == [] and s.master_key is not None  # made in the data dir


def test_with_only_a_port_set_the_processes_connect_to_that_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """``BOTMEMORY_NEO4J_BOLT_PORT=7688 make up`` started Neo4j on 7688 and waited for it on the
    default URI's 7687 (Redis alike). A URI set explicitly is kept as it is."""
    assert (Settings().neo4j_uri, Settings().redis_url) == (
        "bolt://127.0.0.1:7687",
        "redis://127.0.0.1:6379/0",
    )
    monkeypatch.setenv("BOTMEMORY_NEO4J_BOLT_PORT", "7688")
    monkeypatch.setenv("BOTMEMORY_REDIS_PORT", "6380")
    assert (Settings().neo4j_uri, Settings().redis_url) == (
        "bolt://127.0.0.1:7688",
        "redis://127.0.0.1:6380/0",
    )
    monkeypatch.setenv("BOTMEMORY_NEO4J_URI", "bolt://db.internal:7687")
    monkeypatch.setenv("BOTMEMORY_REDIS_URL", "redis://cache:6379/2")
    assert (Settings().neo4j_uri, Settings().redis_url) == ("bolt://db.internal:7687", "redis://cache:6379/2")


def test_a_local_previous_key_file_joins_the_keyring_but_not_in_production(tmp_path: Path) -> None:
    (tmp_path / "master-key.previous").write_text(OLD_KEY + "\n")
    assert Settings(env="local", data_dir=tmp_path).previous_master_key_bytes() == [b"\x09" * 32]
    assert Settings(env="production", data_dir=tmp_path).previous_master_key_bytes() == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not base64!", "not valid base64"),
        (base64.b64encode(b"\x01" * 16).decode(), "32 bytes"),
        (base64.b64encode(b"\x01" * 33).decode(), "32 bytes"),
        ("", "32 bytes"),
    ],
)
def test_decode_key_refuses_and_never_echoes_the_key(value: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        decode_key(SecretStr(value), "BOTMEMORY_MASTER_KEY")
    assert "BOTMEMORY_MASTER_KEY" in str(caught.value)
    assert not value or value not in str(caught.value)


def test_decode_key_accepts_32_bytes() -> None:
    assert decode_key(SecretStr(KEY), "k") == bytes(range(32))


def test_a_missing_master_key_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="missing"):
        Settings().master_key_bytes()


def test_local_secrets_are_generated_private_and_given_ones_are_kept(tmp_path: Path) -> None:
    s = Settings(env="local", data_dir=tmp_path / "new", master_key=SecretStr(KEY)).resolved()
    assert s.master_key_bytes() == bytes(range(32))
    assert not (tmp_path / "new" / "master-key").exists()  # a given secret is never written
    for name in ("neo4j-password", "admin-token"):
        assert (tmp_path / "new" / name).stat().st_mode & 0o777 == 0o600
    assert s.admin_token is not None and s.admin_token.get_secret_value().startswith("adm_")
    assert (tmp_path / "new" / "admin-token").read_text() == s.admin_token.get_secret_value() + "\n"


def _starter(data_dir: str) -> str:
    """One process's first start: the master key it reads or makes."""
    settings = Settings(env="local", data_dir=Path(data_dir)).resolved()
    assert settings.master_key is not None
    return settings.master_key.get_secret_value()


def test_starters_together_all_read_one_whole_key_and_an_empty_one_is_made_again(tmp_path: Path) -> None:
    """The API and a worker start together on a fresh data dir: each reads the key another made,
    and none may read the file between its creation and its write (an empty key; a start killed
    there left it empty for good)."""
    for round_ in range(5):
        data = tmp_path / f"round-{round_}"
        with multiprocessing.get_context("spawn").Pool(6) as pool:
            keys = pool.map(_starter, [str(data)] * 12)
        assert len(set(keys)) == 1 and keys[0]
        assert (data / "master-key").read_text().strip() == keys[0]
        assert sorted(p.name for p in data.iterdir() if p.name.startswith(".")) == []  # nothing aside
    # An empty file (a start killed between creating and writing it) is made again — by one of
    # the starters that find it together, whose key all of them then use (each made its own, and
    # one unlinked another's: a process went on with a key no file held).
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "master-key").write_text("")
    made = _starter(str(empty))
    assert len(base64.b64decode(made)) == 32 and (empty / "master-key").read_text().strip() == made


@pytest.mark.parametrize("missing", ["master_key", "neo4j_password", "admin_token"])
def test_production_needs_every_secret(tmp_path: Path, missing: str) -> None:
    complete = Settings(
        env="production",
        data_dir=tmp_path,
        master_key=SecretStr(KEY),
        neo4j_password=SecretStr("password"),
        admin_token=SecretStr("adm_x"),
    )
    assert complete.resolved() == complete
    with pytest.raises(ConfigurationError, match=f"BOTMEMORY_{missing.upper()}"):
        complete.model_copy(update={missing: None}).resolved()
    assert list(tmp_path.iterdir()) == []


def test_two_starters_that_find_one_empty_key_file_use_the_one_key_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two starters find the same empty key file. One ("late") is held between reading it and
    removing it while the other runs: without turns, the other made a key, linked it and went on
    with it, and the late one then removed that file and made its own — a process using a key that
    no file held (everything it encrypted lost at its next start). They take turns on the data
    directory: the other waits, and both use the one key made."""
    path = tmp_path / "master-key"
    path.write_text("")
    reached, go_on = threading.Event(), threading.Event()
    unlink = Path.unlink

    def held_unlink(self: Path, missing_ok: bool = False) -> None:
        if threading.current_thread().name == "late" and self == path:
            reached.set()
            go_on.wait(30)
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", held_unlink)
    keys: dict[str, str] = {}

    def start(name: str) -> None:
        keys[name] = settings_module.read_or_create(path, lambda: f"key-of-{name}")

    late = threading.Thread(target=start, args=("late",), name="late")
    late.start()
    assert reached.wait(30)
    other = threading.Thread(target=start, args=("other",), name="other")
    other.start()
    other.join(2)  # without turns it ends here, with its own key; with them it waits for "late"
    go_on.set()
    late.join(30)
    other.join(30)
    assert keys["late"] == keys["other"] == path.read_text().strip()


def test_a_secret_is_written_whole_and_private_over_the_old_one(tmp_path: Path) -> None:
    """``rotate-master-key --generate``'s key files: replaced whole (renamed over, never truncated
    in place), 0600 from the first byte whatever the umask, nothing left aside."""
    path = tmp_path / "master-key"
    path.write_text("old\n")
    os.chmod(path, 0o644)
    before = os.umask(0o022)
    try:
        settings_module.write_secret(path, "new")
    finally:
        os.umask(before)
    assert path.read_text() == "new\n" and path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["master-key"]


def test_compose_passes_only_settings_the_code_reads_and_the_rotation_keys() -> None:
    """docker-compose.yml's environment names settings the code reads, and passes on the older
    master keys that the README's rotation gives every process (the containers got the new key
    only: no Bot's data key could be unwrapped)."""
    compose = (Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text()
    named = set(re.findall(r"^\s+(BOTMEMORY_[A-Z0-9_]+):", compose, re.MULTILINE))
    fields = {"BOTMEMORY_" + name.upper() for name in Settings.model_fields}
    assert named and named <= fields, named - fields
    assert {"BOTMEMORY_MASTER_KEY", "BOTMEMORY_PREVIOUS_MASTER_KEYS"} <= named


def test_a_second_generated_key_keeps_every_earlier_one(tmp_path: Path) -> None:
    """``rotate-master-key --generate`` twice before the processes restart: they still wrap new
    Bots' data keys with the first key, which the second run's ``master-key.previous`` replaced
    (one key), so those Bots could not be read after the restart. Every earlier key is kept."""
    first = settings_module.read_or_create(tmp_path / "master-key", cli.new_master_key)
    local = Settings(env="local", data_dir=tmp_path)
    cli._replace_local_key(local)  # pyright: ignore[reportPrivateUsage]
    second = (tmp_path / "master-key").read_text().strip()
    cli._replace_local_key(local)  # pyright: ignore[reportPrivateUsage]
    keyring = local.previous_master_key_bytes()
    assert keyring == [base64.b64decode(first), base64.b64decode(second)]
    assert base64.b64decode((tmp_path / "master-key").read_text().strip()) not in keyring


@pytest.mark.parametrize(("given", "level"), [("debug", "DEBUG"), ("warn", "WARN"), ("NOTSET", "NOTSET")])
def test_a_log_level_is_one_of_loggings_in_any_case(
    monkeypatch: pytest.MonkeyPatch, given: str, level: str
) -> None:
    """Every name ``logging`` takes (``warn``, ``fatal`` and ``notset`` too: they worked before)."""
    monkeypatch.setenv("BOTMEMORY_LOG_LEVEL", given)
    assert Settings().log_level == level


@pytest.mark.parametrize(
    ("given", "missing"),
    [
        (
            {"BOTMEMORY_EMBEDDING_DIMENSIONS": "8", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
            "EMBEDDING_MODEL",
        ),
        (
            {"BOTMEMORY_EMBEDDING_MODEL": "m", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
            "EMBEDDING_DIMENSIONS",
        ),
        # No endpoint named: memory text went to api.openai.com, which nobody had named.
        ({"BOTMEMORY_EMBEDDING_MODEL": "m", "BOTMEMORY_EMBEDDING_DIMENSIONS": "8"}, "EMBEDDING_BASE_URL"),
    ],
)
def test_an_openai_embedder_is_named_whole_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, given: dict[str, str], missing: str
) -> None:
    """Found only when the embedder was made — after the API had migrated the database."""
    monkeypatch.setenv("BOTMEMORY_EMBEDDER", "openai")
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError, match=missing):
        load_settings()
    monkeypatch.setenv("BOTMEMORY_EMBEDDING_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("BOTMEMORY_EMBEDDING_MODEL", "m")
    monkeypatch.setenv("BOTMEMORY_EMBEDDING_DIMENSIONS", "8")
    assert load_settings().embedder == "openai"


def test_the_socket_cap_is_read_by_its_new_name_and_its_old_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sockets a caller may hold are counted per person now; the variable was named per token,
    and a deployment that set it keeps its cap (not silently the default)."""
    monkeypatch.delenv("BOTMEMORY_MAX_SOCKETS_PER_PERSON", raising=False)
    monkeypatch.setenv("BOTMEMORY_MAX_SOCKETS_PER_TOKEN", "3")
    assert Settings().max_sockets_per_person == 3
    monkeypatch.setenv("BOTMEMORY_MAX_SOCKETS_PER_PERSON", "5")
    assert Settings().max_sockets_per_person == 5
    assert Settings(max_sockets_per_person=7).max_sockets_per_person == 7  # by its name in code
    assert (
        Settings.model_validate(
            {**Settings().model_dump(), "max_sockets_per_person": 9}
        ).max_sockets_per_person
        == 9
    )
