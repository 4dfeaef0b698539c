"""Script arguments that look like secrets (specs/secret_args.py), on values."""

from __future__ import annotations

import pytest

from orchestrator.specs.secret_args import SecretArg, looks_secret, secret_args


@pytest.mark.parametrize(
    "option",
    ["--hf_token", "--token", "--api-key", "--API_KEY", "--db-password", "--passwd",
     "--client_secret", "--secret", "--hftoken", "--wandb.apikey", "-key", "--aws_secret_key"],
)  # fmt: skip
def test_options_that_name_a_secret(option: str) -> None:
    assert looks_secret(option)


@pytest.mark.parametrize(
    "option",
    ["--tokenizer", "--max_tokens", "--num-tokens", "--pad_token", "--eos-token",
     "--bos_token_id", "--keep", "--monkey", "--keys-only", "--lr", "--sort-keyword"],
)  # fmt: skip
def test_options_that_do_not(option: str) -> None:
    assert not looks_secret(option)


def test_a_secret_option_with_a_value_in_either_form_is_found_once_in_order() -> None:
    args = ["--lr", "1e-4", "--hf_token", "hf_abc", "--db-password=s3cret", "--hf_token", "x"]
    assert secret_args(args) == (
        SecretArg("--hf_token", "HF_TOKEN"),
        SecretArg("--db-password", "DB_PASSWORD"),
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--hf_token"],  # no value: a switch
        ["--use_auth_token", "--lr", "1"],  # followed by the next option
        ["--use_auth_token", "true"],  # a switch's value
        ["--api-key="],
        ["--", "--hf_token", "abc"],  # after `--`: the script's positional words
        ["--tokenizer", "gpt2", "--pad_token", "0", "train", "token", "abc"],
    ],
)
def test_nothing_is_found_where_no_secret_is_given(args: list[str]) -> None:
    assert secret_args(args) == ()
