"""What a newcomer tries first: ``rmqstore --version``, and sizes written as 64M or 1G on
every option that takes a size."""
import argparse

import pytest
import tomllib
from test_cli import ROOT, run

from rmqstore.cli import build_parser
from rmqstore.cli.common import byte_size


def test_version_is_the_packages():
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert run("--version").stdout.strip() == f"rmqstore {version}"


def _size_options(parser):
    """(command, option, action) of every option whose value is a number of bytes."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                for command, option, a in _size_options(sub):
                    yield f"{name} {command}".strip(), option, a
        elif action.metavar == "BYTES" or "size" in " ".join(action.option_strings):
            yield "", action.option_strings[-1], action


def test_every_size_option_takes_a_suffix():
    options = list(_size_options(build_parser()))
    assert {(c, o) for c, o, _ in options} >= {("put", "--segment-size"), ("serve", "--segment-size"),
                                               ("bench", "--body-size")}
    for command, option, action in options:
        assert action.type("64K") == 64 << 10 and action.type("2m") == 2 << 20, (command, option)
        with pytest.raises(argparse.ArgumentTypeError):
            action.type("1q")


@pytest.mark.parametrize("text,value", [("4096", 4096), ("64k", 65536), ("64M", 64 << 20), ("1G", 1 << 30),
                                        ("0x10", 16)])
def test_byte_size(text, value):
    assert byte_size(text) == value


@pytest.mark.parametrize("text", ["", "M", "0", "-1M", "1.5G", "1 G", "1GB", "1_0"])
def test_byte_size_refuses(text):
    with pytest.raises(argparse.ArgumentTypeError):
        byte_size(text)


def test_serve_and_bench_sizes_parse():
    args = build_parser().parse_args(["serve", "/s", "--segment-size", "64M"])
    assert args.commitlog_file_size == 64 << 20
    assert build_parser().parse_args(["bench", "--body-size", "1K"]).body_size == 1024
    assert build_parser().parse_args(["bench", "--body-size", "0"]).body_size == 0
