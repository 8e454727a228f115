"""`tidebatch features load` on CSV and Parquet files, into a private redis-server."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pipeline.commands import features as features_command
from pipeline.errors import UserError
from pipeline.loadgen.ctr import CtrRequestFactory
from pipeline.redisio.loader import load_features
from tests.integration.redis_helpers import twin, write_csv, write_parquet


def run_cli(argv: list[str]) -> int:
    """The command as pipeline/cli.py would run it (registered there by the lead)."""
    parser = argparse.ArgumentParser(prog="tidebatch")
    features_command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def sample_rows() -> list[dict]:
    pairs = [twin(CtrRequestFactory(seed=4, mean_items=3, max_items=5).make_doc(i)) for i in range(5)]
    return [row for t in pairs for row in t.rows]


def expected_hash(row: dict) -> dict[str, str]:
    return {k: str(v) for k, v in row.items() if k not in ("kind", "id") and v is not None}


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_load_command_writes_one_hash_per_row(fmt, private_redis, tmp_path: Path, capsys) -> None:
    rows = sample_rows()
    path = (write_csv if fmt == "csv" else write_parquet)(tmp_path / f"features.{fmt}", rows)
    client = private_redis.client()
    client.hset("tb:user:stale", "C99", "x")  # untouched: not in the file

    assert run_cli(["features", "load", str(path), "--url", private_redis.url, "--chunk-rows", "7"]) == 0

    users = sum(1 for r in rows if r["kind"] == "user")
    out = capsys.readouterr()
    assert f"loaded {users} users and {len(rows) - users} items" in out.out
    assert "rows loaded" in out.err  # progress, one line per chunk
    for row in rows:
        assert client.hgetall(f"tb:{row['kind']}:{row['id']}") == expected_hash(row)
    assert client.exists("tb:user:stale")


def test_reload_replaces_a_key_and_a_featureless_row_deletes_it(private_redis, tmp_path: Path) -> None:
    client = private_redis.client()
    load_features(client, write_csv(tmp_path / "a.csv", [
        {"kind": "user", "id": "u1", "I1": 5, "C1": "68fd1e64"},
        {"kind": "item", "id": "i1", "I7": 1, "C14": "abc"},
    ]))
    stats = load_features(client, write_csv(tmp_path / "b.csv", [
        {"kind": "user", "id": "u1", "I2": 7},
        {"kind": "item", "id": "i1"},
    ]), key_prefix="tb:")
    assert client.hgetall("tb:user:u1") == {"I2": "7"}  # I1 and C1 did not linger
    assert not client.exists("tb:item:i1")  # no features = absent key = a counted miss
    assert (stats.rows, stats.by_kind) == (2, {"user": 1, "item": 1})


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        ([{"kind": "shop", "id": "s"}], "b.csv line 2: kind: expected 'user' or 'item', got 'shop'"),
        ([{"kind": "user", "id": ""}], "b.csv line 2: id: expected a non-empty id"),
        ([{"kind": "user", "id": "u", "I7": 3}], "b.csv line 2: I7 is not a user feature"),
        ([{"kind": "item", "id": "i", "C14": "xyz"}], "b.csv line 2: C14: expected a hex string of 1..16 digits, got 'xyz'"),
        ([{"kind": "item", "id": "i", "I8": "lots"}], "b.csv line 2: I8: expected a number, got 'lots'"),
    ],
)
def test_bad_rows_are_named(rows, reason, private_redis, tmp_path: Path) -> None:
    with pytest.raises(UserError) as err:
        load_features(private_redis.client(), write_csv(tmp_path / "b.csv", rows))
    assert str(err.value).startswith(reason)


def test_bad_files_are_user_errors(private_redis, tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{}")
    (tmp_path / "cols.csv").write_text("kind,id,C99\nuser,u,1\n")
    (tmp_path / "noid.csv").write_text("kind,C1\nuser,1\n")
    client = private_redis.client()
    with pytest.raises(UserError, match="unknown format"):
        load_features(client, tmp_path / "x.json")
    with pytest.raises(UserError, match="unknown column 'C99'"):
        load_features(client, tmp_path / "cols.csv")
    with pytest.raises(UserError, match="missing column 'id'"):
        load_features(client, tmp_path / "noid.csv")
    with pytest.raises(UserError, match="not found"):
        load_features(client, tmp_path / "nope.csv")


def test_unreachable_redis_is_one_line(tmp_path: Path, private_redis) -> None:
    path = write_csv(tmp_path / "f.csv", [{"kind": "user", "id": "u", "I1": 1}])
    url = private_redis.url
    private_redis.kill()
    with pytest.raises(UserError, match="cannot write to Redis at redis://127.0.0.1"):
        run_cli(["features", "load", str(path), "--url", url, "--quiet"])
