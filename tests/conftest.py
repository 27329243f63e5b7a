"""Shared fixtures. Slow tests (a llama-server build, a real model) run with --runslow."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from llama_sparse.project import Project
from llama_sparse.server import ServerConfig, ServerProcess


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def project() -> Project:
    return Project.find(Path(__file__).parent)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from llama_sparse.models import fetch

    return fetch("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3() -> Path:
    from llama_sparse.models import fetch

    return fetch("gemma3-270m")


@pytest.fixture(scope="session")
def tiny_qwen3() -> Path:
    from llama_sparse.models import fetch

    return fetch("tiny-qwen3")


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start servers for one test; every one is stopped when the test ends, pass or fail."""
    started: list[ServerProcess] = []

    def start(config: ServerConfig, name: str = "server") -> ServerProcess:
        server = ServerProcess(config, tmp_path / f"{name}-{len(started)}.log")
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()
