"""Flags as Go controllers take them: `--x=false`, bare `--x`, Go durations."""

from __future__ import annotations

import argparse

import pytest

from slinky.kube import flags


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    flags.add_bool(p, "--leader-elect", default=True, help="elect")
    flags.add_duration(p, "--period", default="2s")
    return p


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        ([], True),
        (["--leader-elect"], True),
        (["--leader-elect=true"], True),
        (["--leader-elect=false"], False),
        (["--leader-elect=0"], False),
        (["--leader-elect=True"], True),
        (["--no-leader-elect"], False),
    ],
)
def test_boolean_flags_accept_every_go_spelling(argv: list[str], want: bool) -> None:
    assert parser().parse_args(argv).leader_elect is want


def test_boolean_flag_rejects_garbage_with_a_clear_message(
    capsys: pytest.CaptureFixture[str],
) -> None:
    p = argparse.ArgumentParser()
    flags.add_bool(p, "--leader-elect", default=True, help="elect")
    with pytest.raises(SystemExit):
        p.parse_args(["--leader-elect=maybe"])
    assert "invalid boolean 'maybe'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("1m30s", 90), ("500ms", 0.5), ("1.5h", 5400), ("0", 0), ("2h3m4s", 7384)],
)
def test_durations_parse_go_syntax(text: str, seconds: float) -> None:
    assert flags.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5sfoo", "ten seconds", "-1s", "1d"])
def test_bad_durations_are_rejected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration"):
        flags.parse_duration(text)


def test_default_duration_is_parsed_too() -> None:
    assert parser().parse_args([]).period == 2.0
    assert parser().parse_args(["--period=1m"]).period == 60.0


def test_uninstall_timeout_takes_a_go_duration_and_a_bad_kubeconfig_is_a_clear_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from slinky.bridge import uninstall as bridge_uninstall
    from slinky.operator import uninstall as operator_uninstall

    assert operator_uninstall.main(["--timeout=1h", "--kubeconfig=/nonexistent"]) == 2
    assert bridge_uninstall.main(["--kubeconfig=/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err.count("cannot start: kubeconfig: Configuration file /nonexistent not found") == 2
