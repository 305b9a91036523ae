"""Settings: local secrets generated into the data dir, production refuses without them, no secret leaks."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from services.settings import ConfigurationError, Settings


def test_local_secrets_are_generated_once_and_kept(tmp_path: Path) -> None:
    first = Settings(env="local", data_dir=tmp_path).resolved()
    second = Settings(env="local", data_dir=tmp_path).resolved()
    assert first.master_key is not None
    assert second.master_key is not None
    assert first.master_key.get_secret_value() == second.master_key.get_secret_value()
    assert len(first.master_key_bytes()) == 32
    assert (tmp_path / "admin-token").stat().st_mode & 0o077 == 0
    text = repr(first) + str(first.model_dump())
    for secret in (first.master_key, first.admin_token, first.neo4j_password):
        assert secret is not None
        assert secret.get_secret_value() not in text


def test_production_refuses_to_start_without_a_master_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="MASTER_KEY"):
        Settings(
            env="production",
            data_dir=tmp_path,
            admin_token=SecretStr("a" * 40),
            neo4j_password=SecretStr("p" * 12),
        ).resolved()
    assert not (tmp_path / "master-key").exists()


def test_bad_master_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="32 bytes"):
        Settings(
            env="production",
            data_dir=tmp_path,
            master_key=SecretStr("c2hvcnQ="),
            admin_token=SecretStr("a" * 40),
            neo4j_password=SecretStr("p" * 12),
        ).resolved().master_key_bytes()
