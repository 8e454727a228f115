"""consumers/profiles.py PROFILES is the one list of broker profiles: every
--broker-profile offers exactly its names (and so does completion, which reads the
parser), the config check accepts exactly them, and every settings table has a row for
each and no other."""

from __future__ import annotations

import argparse

import pytest

import consumers.profiles as profiles
from consumers.profiles import PROFILES, check_profile
from pipeline.cli import build_parser
from pipeline.completion.parser_tree import flag_actions, walk
from pipeline.completion.tree import command_tree
from pipeline.config import load_config
from pipeline.errors import UserError

NAMES = tuple(PROFILES)


def _profile_flags() -> list[tuple[str, argparse.Action]]:
    return [(" ".join(path), a) for path, parser in walk(build_parser())
            for a in flag_actions(parser) if "--broker-profile" in a.option_strings]


def test_every_broker_profile_flag_offers_the_registry() -> None:
    flags = _profile_flags()
    assert {path for path, _ in flags} >= {"run", "produce ctr", "etl", "dlq inspect", "dlq replay", "generate", "profile"}
    for path, action in flags:
        assert tuple(action.choices or ()) == NAMES, path
        for name, broker in PROFILES.items():  # the help says what each is for
            assert f"{name} for {broker}" in (action.help or ""), path


def test_completion_offers_the_registry() -> None:
    offered = [f.choices for c in command_tree(build_parser()) for f in c.flags if "--broker-profile" in f.names]
    assert len(offered) == len(_profile_flags())
    assert set(offered) == {NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_the_config_check_takes_each_profile(name: str) -> None:
    assert load_config(overrides={"broker_profile": name}, environ={}).broker_profile == name
    assert check_profile(name) == name


def test_the_config_check_refuses_another_naming_them_all() -> None:
    with pytest.raises(UserError, match=r"broker_profile.*'tansu' is not one of " + ", ".join(NAMES)):
        load_config(overrides={"broker_profile": "tansu"}, environ={})


@pytest.mark.parametrize("table", ["_CONSUMER_PROFILE", "_PRODUCER_PROFILE", "_KP_CONSUMER_PROFILE",
                                   "_KP_PRODUCER_PROFILE", "_FAUST_PROFILE", "FAUST_FETCH_MAX_WAIT_MS"])
def test_every_settings_table_has_a_row_per_profile(table: str) -> None:
    assert tuple(getattr(profiles, table)) == NAMES
