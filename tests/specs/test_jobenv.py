"""The job environment: which variables a job gets, names and values checked, secrets redacted."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.errors import UsageError
from orchestrator.specs.jobenv import (
    JOB_ID_VAR,
    build_job_env,
    is_secret,
    looks_like_token,
    redact,
)
from orchestrator.specs.stop import StopSettings


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "", "A;B", "A=B"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="invalid environment variable name"):
        build_job_env("j", {name: "x"}, environ={})


def test_nul_in_value_is_refused() -> None:
    with pytest.raises(UsageError, match="NUL"):
        build_job_env("j", {"A": "x\0y"}, environ={})


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="\0", codec="utf-8"), max_size=40))
def test_any_value_without_nul_is_kept_as_given(value: str) -> None:
    assert build_job_env("j", {"X": value}, environ={})["X"] == value


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("wandb_api_key", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("NCCL_IB_GID_INDEX", False),
        ("PATH", False),
        ("GCP_CREDENTIALS", True),
        ("PGPASSWORD", True),
        ("DB_PASS", True),
        ("MYSQL_PWD", True),
        ("PWD", False),  # the working directory
        ("TOKENIZERS_PARALLELISM", False),
        ("NCCL_DEBUG", False),
        ("CUDA_VISIBLE_DEVICES", False),
    ],
)
def test_is_secret(name: str, secret: bool) -> None:
    assert is_secret(name) is secret


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("hf_aBcDeFgHiJkLmNoPqRsT", True),
        ("ghp_0123456789abcdefABCDEF", True),
        ("sk-proj-abcdef0123456789", True),
        ("AKIAIOSFODNN7EXAMPLE", True),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig", True),
        ("postgres://user:hunter2@db.example:5432/x", True),
        ("3f2a9c1e7b4d8a6f0e5c2b9d1a7f3e8c", True),  # hex, as API keys often are
        ("123e4567-e89b-12d3-a456-426614174000", True),  # a UUID
        ("INFO", False),
        ("0,1,2,3", False),
        ("eth0", False),
        ("/public/huggingface-models/Wan-AI/Wan2.2-I2V-A14B/high_noise_model", False),
        ("my-very-long-experiment-name-2024-run", False),
        ("https://example.org/path", False),
        ("hf_x", False),  # too short for a token
    ],
)
def test_looks_like_token(value: str, token: bool) -> None:
    assert looks_like_token(value) is token


def test_redact_hides_only_secret_values() -> None:
    env = {"HF_TOKEN": "hf_abc", "NCCL_DEBUG": "INFO", "MY_PASSWORD": "p",
           "SERVICE": "ghp_0123456789abcdefABCDEF"}  # fmt: skip
    assert redact(env) == {"HF_TOKEN": "***", "NCCL_DEBUG": "INFO", "MY_PASSWORD": "***",
                           "SERVICE": "***"}  # fmt: skip
    assert env["HF_TOKEN"] == "hf_abc"


def test_the_launchers_shutdown_follows_the_grace_and_a_users_own_value_wins() -> None:
    from orchestrator.specs.stop import StopSettings

    env = build_job_env("job-1", {}, environ={}, stop=StopSettings(grace=40.5))
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "56"
    mine = build_job_env("job-1", {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "600"}, environ={})
    assert mine["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "600"


def test_build_job_env_order_and_sources() -> None:
    environ = {
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_IB_DISABLE": "1",
        "HF_TOKEN": "t",
        "WANDB_PROJECT": "p",
        "HOME": "/root",
        "UNSET_ELSEWHERE": "x",
    }
    env = build_job_env(
        "job-1",
        {"NCCL_IB_DISABLE": "0", "EXTRA": "e"},
        passthrough=["HF_TOKEN", "WANDB_PROJECT", "NOT_SET"],
        environ=environ,
    )
    assert env == {
        JOB_ID_VAR: "job-1",
        "ORCH_RESTART_COUNT": "0",  # the first attempt
        "ORCH_STOP_SIGNAL": "SIGTERM",  # what a stop sends every rank, and its grace
        "ORCH_STOP_GRACE": "120",
        # torchrun and accelerate kill their ranks only after the grace and the teardown
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "135",
        "NCCL_IB_DISABLE": "0",
        "NCCL_SOCKET_IFNAME": "eth0",
        "HF_TOKEN": "t",
        "WANDB_PROJECT": "p",
        "EXTRA": "e",
    }
    assert next(iter(env)) == JOB_ID_VAR
    assert "HOME" not in env


def test_each_attempt_sees_its_restart_count_which_the_user_cannot_set() -> None:
    assert build_job_env("job-1", {}, environ={}, restart_count=2)["ORCH_RESTART_COUNT"] == "2"
    with pytest.raises(UsageError, match="ORCH_RESTART_COUNT is set by orch"):
        build_job_env("job-1", {"ORCH_RESTART_COUNT": "5"}, environ={})
    forwarded = build_job_env("job-1", {}, ["ORCH_RESTART_COUNT"], {"ORCH_RESTART_COUNT": "9"})
    assert forwarded["ORCH_RESTART_COUNT"] == "0"


def test_the_ranks_see_the_stop_signal_and_grace_which_the_user_cannot_set() -> None:
    stop = StopSettings("SIGUSR1", 300.0)
    env = build_job_env("job-1", {}, environ={}, stop=stop)
    assert (env["ORCH_STOP_SIGNAL"], env["ORCH_STOP_GRACE"]) == ("SIGUSR1", "300")
    with pytest.raises(UsageError, match="ORCH_STOP_GRACE is set by orch"):
        build_job_env("job-1", {"ORCH_STOP_GRACE": "5"}, environ={}, stop=stop)
    forwarded = build_job_env("job-1", {}, ["ORCH_STOP_SIGNAL"], {"ORCH_STOP_SIGNAL": "SIGINT"})
    assert forwarded["ORCH_STOP_SIGNAL"] == "SIGTERM"


def test_job_id_cannot_be_overridden() -> None:
    with pytest.raises(UsageError, match=JOB_ID_VAR):
        build_job_env("job-1", {JOB_ID_VAR: "other"}, environ={})
    with pytest.raises(UsageError):
        build_job_env("", {}, environ={})


def test_bad_extra_name_is_refused() -> None:
    with pytest.raises(UsageError):
        build_job_env("j", {"BAD NAME": "x"}, environ={})
